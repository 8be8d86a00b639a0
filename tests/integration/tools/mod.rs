//! The command-line tools: the benchmark client and the demo.

/// The CSI load generator.
mod bench;
/// The demo command.
mod demo;
