use std::process::Command;

/// A `cargo` command from the toolchain that runs this xtask.
pub(crate) fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

/// Runs a command, inheriting output; an error names the command.
pub(crate) fn run(cmd: &mut Command) -> Result<(), String> {
    let status = cmd.status().map_err(|e| format!("{cmd:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?} failed with {status}"))
    }
}

/// Prints a step heading.
pub(crate) fn step(name: &str) {
    println!("\n==> {name}");
}
