//! `delayctl completions` and `delayctl man`: shell completion scripts and manual pages,
//! both generated from the command line's own definition ([`crate::cli::Cli`]), so they
//! never disagree with it.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::CommandFactory;
use clap_complete::Shell;

use crate::cli::{Cli, VERSION};

/// Writes the completion script for `shell` to `out`.
pub fn completions(shell: Shell, out: &mut dyn Write) -> Result<()> {
    // Rendered in memory first: the generator panics on a failed write (a closed pipe),
    // where delayctl should report it.
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "delayctl", &mut script);
    out.write_all(&script).context("cannot write the completion script")?;
    out.flush().context("cannot write the completion script")
}

/// The manual page of `cmd` (delayctl or one of its commands, once built), in roff.
fn render(cmd: clap::Command) -> Result<Vec<u8>> {
    let man = clap_mangen::Man::new(cmd).source(format!("delayctl {VERSION}")).manual("delayd");
    let mut page = Vec::new();
    man.render(&mut page).context("cannot render the manual page")?;
    let page = String::from_utf8(page).context("the manual page is not UTF-8")?;
    // The renderer puts its definition of the apostrophe string (`.ie \n(.g .ds Aq ...`)
    // before the title; a page conventionally starts with `.TH` (what `man` and `file`
    // recognise), and the definition works as well after it.
    let mut lines: Vec<&str> = page.lines().collect();
    if let Some(at) = lines.iter().position(|l| l.starts_with(".TH ")) {
        let title = lines.remove(at);
        lines.insert(0, title);
    }
    let mut out = lines.join("\n");
    out.push('\n');
    Ok(out.into_bytes())
}

/// Writes the main manual page, `delayctl.1`, to `out`.
pub fn man_page(out: &mut dyn Write) -> Result<()> {
    out.write_all(&render(Cli::command())?).context("cannot write the manual page")?;
    out.flush().context("cannot write the manual page")
}

/// Writes `delayctl.1` and one page per command and subcommand (`delayctl-deadletter-peek.1`)
/// into `dir`, creating it if missing; returns the files written, the main page first.
pub fn man_pages(dir: &Path) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut cmd = Cli::command().disable_help_subcommand(true);
    // Built, every subcommand knows its full name (`delayctl-deadletter-peek`) and the
    // global options.
    cmd.build();
    let mut written = Vec::new();
    write_pages(&cmd, dir, &mut written)?;
    Ok(written)
}

fn write_pages(cmd: &clap::Command, dir: &Path, written: &mut Vec<PathBuf>) -> Result<()> {
    let name = cmd.get_display_name().unwrap_or_else(|| cmd.get_name()).to_string();
    let path = dir.join(format!("{name}.1"));
    std::fs::write(&path, render(cmd.clone())?)
        .with_context(|| format!("cannot write {}", path.display()))?;
    written.push(path);
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_pages(sub, dir, written)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every command and subcommand's name, as `["cluster", "cluster status", ...]`.
    fn command_paths(cmd: &clap::Command, prefix: &str, out: &mut Vec<String>) {
        for sub in cmd.get_subcommands() {
            let path = format!("{prefix}{}", sub.get_name());
            out.push(path.clone());
            command_paths(sub, &format!("{path} "), out);
        }
    }

    #[test]
    fn bash_completions_know_every_command() -> Result<()> {
        let mut script = Vec::new();
        completions(Shell::Bash, &mut script)?;
        let script = String::from_utf8(script)?;
        let mut paths = Vec::new();
        command_paths(&Cli::command(), "", &mut paths);
        assert!(paths.len() > 40, "{paths:?}");
        for path in paths {
            // clap_complete's bash script (4.6) has a state per command, named
            // `delayctl__subcmd__cluster__subcmd__status`.
            let state = format!("delayctl__subcmd__{}", path.replace(' ', "__subcmd__"));
            assert!(script.contains(&state), "no completion for `{path}` ({state})");
        }
        for flag in ["--addr", "--json", "--delay", "--webhook-timeout-ms", "--all"] {
            assert!(script.contains(flag), "{flag}");
        }
        for shell in [Shell::Zsh, Shell::Fish, Shell::PowerShell, Shell::Elvish] {
            let mut out = Vec::new();
            completions(shell, &mut out)?;
            assert!(String::from_utf8(out)?.contains("republish"), "{shell}");
        }
        Ok(())
    }

    #[test]
    fn manual_pages_are_roff_for_every_command() -> Result<()> {
        let mut page = Vec::new();
        man_page(&mut page)?;
        let page = String::from_utf8(page)?;
        let th = page.lines().next().unwrap_or_default();
        assert!(th.starts_with(".TH delayctl 1 ") && th.contains(VERSION), "{th}");
        assert!(page.contains(".SH NAME") && page.contains(".SH SYNOPSIS"), "{page}");
        assert!(page.contains("release") && page.contains("\\-\\-json"), "{page}");

        let dir = tempfile::tempdir()?;
        let written = man_pages(&dir.path().join("man1"))?;
        let names: Vec<String> =
            written.iter().filter_map(|p| p.file_name()?.to_str().map(str::to_string)).collect();
        assert_eq!(names.first().map(String::as_str), Some("delayctl.1"));
        for want in ["delayctl-release.1", "delayctl-deadletter-peek.1", "delayctl-key-cancel.1"] {
            assert!(names.iter().any(|n| n == want), "no {want} in {names:?}");
        }
        let mut paths = Vec::new();
        command_paths(&Cli::command(), "", &mut paths);
        assert_eq!(names.len(), paths.len() + 1, "one page per command: {names:?}");
        for path in &written {
            let text = std::fs::read_to_string(path)?;
            let th = text.lines().next().unwrap_or_default();
            let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or_default();
            assert!(th.starts_with(&format!(".TH {stem} 1 ")), "{}: {th}", path.display());
        }
        let peek = std::fs::read_to_string(dir.path().join("man1/delayctl-deadletter-peek.1"))?;
        assert!(peek.contains("\\-\\-limit") && peek.contains("\\-\\-addr"), "{peek}");
        check_with_groff(&written)
    }

    /// Where groff is installed (Debian's groff-base, as on the project's machines), each
    /// page must format without a single warning. `-k` runs preconv first, as `man` does:
    /// the help text has UTF-8 (`≤`).
    fn check_with_groff(pages: &[PathBuf]) -> Result<()> {
        let probe = std::process::Command::new("groff").arg("-v").output();
        if !probe.is_ok_and(|o| o.status.success()) {
            eprintln!("groff is not installed: the pages' roff is not checked by it");
            return Ok(());
        }
        for page in pages {
            let out = std::process::Command::new("groff")
                .args(["-k", "-man", "-Tutf8", "-ww", "-z"])
                .arg(page)
                .output()?;
            let warnings = String::from_utf8_lossy(&out.stderr);
            assert!(
                out.status.success() && warnings.trim().is_empty(),
                "{}: {warnings}",
                page.display()
            );
        }
        Ok(())
    }
}
