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

/// A directory of the workspace, given relative to its root.
pub(crate) fn workspace_dir(relative: &str) -> std::path::PathBuf {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    root.parent().unwrap_or(root).join(relative)
}

/// `npm` run in `dir`, without update, funding or audit chatter.
pub(crate) fn npm_in(dir: &std::path::Path) -> Command {
    let mut cmd = Command::new("npm");
    cmd.current_dir(dir)
        .env("npm_config_update_notifier", "false")
        .env("npm_config_fund", "false")
        .env("npm_config_audit", "false");
    cmd
}

/// Runs `npm ci` in `dir` only when node_modules is missing or older than
/// package-lock.json; quiet when all is there.
pub(crate) fn npm_ci_if_stale(dir: &std::path::Path, what: &str) -> Result<(), String> {
    let modified = |p: std::path::PathBuf| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let lock = modified(dir.join("package-lock.json"));
    let installed = modified(dir.join("node_modules").join(".package-lock.json"));
    let stale = match (lock, installed) {
        (Some(lock), Some(installed)) => installed < lock,
        _ => true,
    };
    if stale {
        step(&format!("setup: npm ci ({what})"));
        run(npm_in(dir).args(["ci", "--loglevel=error"]))?;
    }
    Ok(())
}
