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

/// Prints a step heading with the time since the first step (`[mm:ss]`), so that a run's
/// output says where its time went.
pub(crate) fn step(name: &str) {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let elapsed = START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_secs();
    println!("\n==> [{:02}:{:02}] {name}", elapsed / 60, elapsed % 60);
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

/// Removes the copies of this workspace's own crates that `cargo package` unpacked from its
/// temporary local registry in an earlier run. Cargo unpacks a registry crate once per
/// registry path and version and never again, so a second run in a checkout at the same
/// path (a CI clone, say) would build against the previous run's sources of the same
/// version. Local registries are the folders of `$CARGO_HOME/registry/src` whose name
/// starts with `-`; crates.io's are never touched.
pub(crate) fn forget_local_packages(names: &[&str]) -> Result<(), String> {
    let home = std::env::var_os("CARGO_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".cargo")));
    if let Some(h) = home {
        forget_in(&h.join("registry").join("src"), names)?;
    }
    forget_builds(&target_dir(), names)
}

/// Cargo's target directory: `CARGO_TARGET_DIR`, or the workspace's `target`.
pub(crate) fn target_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| workspace_dir("target"))
}

/// Forgets the builds of our crates made from a local registry (the package check's), so
/// that the next check compiles them again: cargo takes a registry crate's build as final
/// for its version, so a changed package of the same version would link the old build. A
/// build is known by its dep-info file (`deps/<crate>-<hash>.d`, which names its sources);
/// removing its fingerprint (`.fingerprint/<crate>-<hash>`) makes cargo rebuild it.
fn forget_builds(target: &std::path::Path, names: &[&str]) -> Result<(), String> {
    let Ok(profiles) = std::fs::read_dir(target) else {
        return Ok(());
    };
    for profile in profiles.flatten() {
        let Ok(deps) = std::fs::read_dir(profile.path().join("deps")) else {
            continue;
        };
        for dep in deps.flatten() {
            let file = dep.file_name().to_string_lossy().into_owned();
            let Some(stem) = file.strip_suffix(".d") else {
                continue;
            };
            let Some((lib, hash)) = stem.rsplit_once('-') else {
                continue;
            };
            let Some(name) = names.iter().find(|n| n.replace('-', "_") == lib) else {
                continue;
            };
            let local = std::fs::read_to_string(dep.path()).is_ok_and(|info| {
                info.contains(&format!("registry{0}src{0}-", std::path::MAIN_SEPARATOR))
            });
            let fingerprint = profile
                .path()
                .join(".fingerprint")
                .join(format!("{name}-{hash}"));
            if local && fingerprint.exists() {
                std::fs::remove_dir_all(&fingerprint)
                    .map_err(|e| format!("removing {}: {e}", fingerprint.display()))?;
            }
        }
    }
    Ok(())
}

fn forget_in(src: &std::path::Path, names: &[&str]) -> Result<(), String> {
    let Ok(registries) = std::fs::read_dir(src) else {
        return Ok(());
    };
    for registry in registries.flatten() {
        if !registry.file_name().to_string_lossy().starts_with('-') {
            continue;
        }
        let Ok(crates) = std::fs::read_dir(registry.path()) else {
            continue;
        };
        for krate in crates.flatten() {
            let name = krate.file_name().to_string_lossy().into_owned();
            let ours = names.iter().any(|n| {
                name.strip_prefix(n)
                    .and_then(|rest| rest.strip_prefix('-'))
                    .is_some_and(|version| version.starts_with(|c: char| c.is_ascii_digit()))
            });
            if ours {
                std::fs::remove_dir_all(krate.path())
                    .map_err(|e| format!("removing {}: {e}", krate.path().display()))?;
            }
        }
    }
    Ok(())
}

/// Installs the Debian packages of `packages` that are not installed yet, with `apt-get`
/// (through `sudo` unless running as root); quiet when all are there.
pub(crate) fn apt_install(packages: &[&str]) -> Result<(), String> {
    let missing: Vec<&str> = packages
        .iter()
        .copied()
        .filter(|p| {
            !Command::new("dpkg-query")
                .args(["-W", "-f=${Status}", p])
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        })
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    step(&format!("setup: apt-get install {}", missing.join(" ")));
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    let apt = |args: &[&str]| {
        let mut cmd = if root {
            Command::new("apt-get")
        } else {
            let mut c = Command::new("sudo");
            c.arg("apt-get");
            c
        };
        cmd.args(args).env("DEBIAN_FRONTEND", "noninteractive");
        cmd
    };
    // dpkg talks a lot even under -qq: its output is shown only when a step fails.
    let quiet = |cmd: &mut Command| -> Result<(), String> {
        let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
        if out.status.success() {
            return Ok(());
        }
        eprint!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Err(format!("{cmd:?} failed: {}", out.status))
    };
    quiet(&mut apt(&["update", "-qq"]))?;
    let mut install = apt(&["install", "-y", "-qq", "--no-install-recommends"]);
    install.args(&missing);
    quiet(&mut install)
}

/// Runs the cargo build `cmd` and returns the path of the executable it built for the target
/// named `name`, read from cargo's own build messages (so any `CARGO_TARGET_DIR` is
/// honoured); diagnostics go to stderr as usual.
pub(crate) fn built_executable(
    cmd: &mut Command,
    name: &str,
) -> Result<std::path::PathBuf, String> {
    cmd.args(["--quiet", "--message-format=json-render-diagnostics"])
        .stderr(std::process::Stdio::inherit());
    let output = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if !output.status.success() {
        return Err(format!("{cmd:?} failed with {}", output.status));
    }
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .find_map(|line| executable_of(line, name))
        .ok_or_else(|| format!("{cmd:?} named no executable {name}"))
}

/// The executable of target `name` in one line of cargo's JSON messages, if it names one
/// that is not a test harness.
fn executable_of(line: &str, name: &str) -> Option<std::path::PathBuf> {
    let message: serde_json::Value = serde_json::from_str(line).ok()?;
    if message["reason"] != "compiler-artifact"
        || message["target"]["name"] != name
        || message["profile"]["test"] == true
    {
        return None;
    }
    message["executable"].as_str().map(std::path::PathBuf::from)
}

#[cfg(test)]
mod tests {
    use super::{executable_of, forget_builds, forget_in};
    use std::path::PathBuf;

    #[test]
    fn forgets_the_builds_of_our_crates_from_local_registries_only() {
        let target = std::env::temp_dir().join(format!("xtask-builds-{}", std::process::id()));
        let debug = target.join("debug");
        std::fs::create_dir_all(debug.join("deps")).unwrap();
        let local = format!(
            "/h/.cargo/registry{0}src{0}-abc/idem-core-0.1.0/src/lib.rs",
            std::path::MAIN_SEPARATOR
        );
        let builds = [
            ("idem_core-111", "idem-core-111", local.as_str()),
            (
                "idem_core-222",
                "idem-core-222",
                "/work/idem-core/src/lib.rs",
            ),
            ("serde-333", "serde-333", local.as_str()),
        ];
        for (dep, fingerprint, source) in builds {
            std::fs::write(
                debug.join("deps").join(format!("{dep}.d")),
                format!("x: {source}\n"),
            )
            .unwrap();
            std::fs::create_dir_all(debug.join(".fingerprint").join(fingerprint)).unwrap();
        }
        forget_builds(&target, &["idem-core"]).unwrap();
        let kept: Vec<bool> = builds
            .iter()
            .map(|(_, f, _)| debug.join(".fingerprint").join(f).exists())
            .collect();
        std::fs::remove_dir_all(&target).unwrap();
        assert_eq!(kept, [false, true, true]);
    }

    #[test]
    fn forgets_our_crates_in_local_registries_only() {
        let src = std::env::temp_dir().join(format!("xtask-forget-{}", std::process::id()));
        let dirs = [
            "-abc/idem-core-0.1.0",
            "-abc/idem-core-extra-0.1.0",
            "-abc/serde-1.0.0",
            "-def/idem-spec-0.2.0",
            "index.crates.io-123/idem-core-0.1.0",
        ];
        for d in dirs {
            std::fs::create_dir_all(src.join(d)).unwrap();
        }
        forget_in(&src, &["idem-core", "idem-spec"]).unwrap();
        let kept: Vec<bool> = dirs.iter().map(|d| src.join(d).exists()).collect();
        std::fs::remove_dir_all(&src).unwrap();
        assert_eq!(kept, [false, true, true, false, true]);
    }

    #[test]
    fn reads_the_executable_of_a_cargo_message() {
        let line = r#"{"reason":"compiler-artifact","target":{"name":"idem-conformance"},"executable":"/t/release/idem-conformance","fresh":true}"#;
        assert_eq!(
            executable_of(line, "idem-conformance"),
            Some(PathBuf::from("/t/release/idem-conformance"))
        );
        assert_eq!(executable_of(line, "axum-orders"), None);
        let escaped = r#"{"reason":"compiler-artifact","target":{"name":"x"},"executable":"C:\\t\\idem \"x\".exe"}"#;
        assert_eq!(
            executable_of(escaped, "x"),
            Some(PathBuf::from(r#"C:\t\idem "x".exe"#))
        );
        let harness = r#"{"reason":"compiler-artifact","target":{"name":"x"},"profile":{"test":true},"executable":"/t/debug/deps/x-0123"}"#;
        assert_eq!(executable_of(harness, "x"), None);
        let library = r#"{"reason":"compiler-artifact","target":{"name":"x"},"executable":null}"#;
        assert_eq!(executable_of(library, "x"), None);
        assert_eq!(executable_of(r#"{"executable":"/unterminated"#, "x"), None);
    }
}
