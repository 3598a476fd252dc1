//! One integration-test binary; each module covers one capability.

mod allocator;
mod analysis;
mod captured;
mod categories;
mod cli;
mod common;
mod decode;
mod diagnosis;
mod edges;
mod explain;
mod fields2026;
mod forgery;
mod headline;
mod hostile;
mod labels;
mod parallel;
mod replica;
mod robustness;
mod salvage;
mod sql;
mod svg;
mod synthetic;
mod view;
mod whatif;
mod work;
mod workflow;
