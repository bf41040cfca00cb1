//! `#[ptx::kernel]`, the entry-point attribute of the device crate (`nvfp4-gemm-kernel`).
//!
//! The attribute only hands the function to the kernel crate's `ptx::entry_point!`, a
//! `macro_rules!` macro defined once per target (an exported `extern "ptx-kernel"` function on
//! nvptx64, a plain Rust function on the host): a proc-macro runs on the host and cannot see the
//! target it expands for, while `macro_rules!` definitions are selected by `#[cfg]`. An attribute
//! proc-macro is stable Rust, so the host build of the kernel crate needs no nightly feature.
//!
//! `#[ptx::kernel] pub unsafe fn f(p: P) { .. }` expands to
//! `crate::ptx::entry_point! { pub unsafe fn f(p: P) { .. } }`, resolved in the crate that uses it.

use proc_macro::{Delimiter, Group, TokenStream, TokenTree};

/// Marks a kernel entry point; see the kernel crate's `ptx::kernel`.
#[proc_macro_attribute]
pub fn kernel(attr: TokenStream, item: TokenStream) -> TokenStream {
    if !attr.is_empty() {
        return "compile_error!(\"`#[ptx::kernel]` takes no arguments\");".parse().expect("a valid token stream");
    }
    let mut out: TokenStream = "crate::ptx::entry_point!".parse().expect("a valid path");
    out.extend([TokenTree::Group(Group::new(Delimiter::Brace, item))]);
    out
}
