//! `idem-conformance`: see `conformance/README.md`.

fn main() -> std::process::ExitCode {
    std::process::ExitCode::from(idem_conformance::cli::main())
}
