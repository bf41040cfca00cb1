//! The `nvfp4-gemm` command-line tool, as a library: the file format and its validation
//! ([`file`]), the shape language ([`spec`]), the commands ([`commands`]) and the error type
//! ([`error`]). Parsing and validation never touch a GPU, so their error paths are tested on any
//! machine; only [`commands::compute`] (and `run`, `info`) open one.
#![warn(missing_docs)]

pub mod commands;
pub mod error;
pub mod file;
pub mod spec;

pub use error::CliError;
