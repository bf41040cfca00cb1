//! The README's "Use it in an MoE layer" code is the doctest of `nvfp4_gemm::moe`, which
//! `cargo test` compiles: this keeps the two identical. CPU only.

#[test]
fn readme_moe_example_is_the_compiled_doctest() {
    // Embedded, so that the bundled binary runs anywhere.
    let readme = include_str!("../../README.md");
    let section = readme.split("## Use it in an MoE layer").nth(1).expect("README has the MoE section");
    let block = section.split("```rust,no_run\n").nth(1).unwrap().split("\n```").next().unwrap();
    let source = include_str!("../../host/src/moe.rs");
    let doc = source.split("//! ```no_run\n").nth(1).unwrap().split("//! ```\n").next().unwrap();
    let doctest: Vec<&str> =
        doc.lines().map(|l| l.strip_prefix("//! ").unwrap_or_else(|| l.strip_prefix("//!").unwrap())).collect();
    assert_eq!(block, doctest.join("\n"), "README's MoE example differs from host/src/moe.rs's doctest");
}
