//! The repository's README and this crate's open with the axum example's program: the block
//! under their `readme-test` marker is the code of `examples/axum-orders.rs` as it stands
//! (from its first `use`), so what they show is what `cargo test` compiles and the
//! repository's test command runs under the conformance suite.

use std::path::Path;

const MARKER: &str = "<!-- readme-test: idem-tower/examples/axum-orders.rs -->\n```rust\n";

#[test]
fn the_readmes_show_the_example_as_it_is() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let example = std::fs::read_to_string(crate_dir.join("examples/axum-orders.rs"))
        .expect("examples/axum-orders.rs");
    let code = &example[example.find("use axum").expect("the example's first use")..];
    for readme in [crate_dir.join("README.md"), crate_dir.join("../README.md")] {
        let text = std::fs::read_to_string(&readme).expect("the README");
        let start = text
            .find(MARKER)
            .unwrap_or_else(|| panic!("{} has no {MARKER:?}", readme.display()))
            + MARKER.len();
        let len = text[start..].find("```\n").expect("the block's end");
        assert_eq!(
            &text[start..start + len],
            code,
            "{}'s program is not examples/axum-orders.rs: copy the example's code into it",
            readme.display()
        );
    }
}
