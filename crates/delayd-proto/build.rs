fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A vendored protoc keeps the build independent of the machine's packages.
    std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?);
    tonic_prost_build::configure().compile_protos(
        &["../../proto/raft.proto", "../../proto/delayd.proto"],
        &["../../proto"],
    )?;
    Ok(())
}
