fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A vendored protoc keeps the build independent of the machine's packages.
    std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?);
    // The protos live outside this crate, where cargo does not look for changes by itself:
    // without this, editing one left the generated code stale in an existing target dir.
    println!("cargo:rerun-if-changed=../../proto");
    tonic_prost_build::configure().compile_protos(
        &["../../proto/raft.proto", "../../proto/delayd.proto"],
        &["../../proto"],
    )?;
    Ok(())
}
