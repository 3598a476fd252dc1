//! One integration-test binary; each module covers one capability.

mod analysis;
mod common;
mod decode;
mod robustness;
mod explain;
mod svg;
