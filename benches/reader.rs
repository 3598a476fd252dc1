//! Throughput of the reader (and of its memo walk), the replay and the whole report, in input bytes per second, on the largest real
//! fixture (3.9 MB, 22k trace entries with stacks). Run with `cargo bench --features bench`;
//! `bench/run.sh` measures whole commands on 10 MB – 1 GB files.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};

use snapscan::analysis::lifetimes::replay_device;
use snapscan::analysis::report::{device_report, ReportOptions};
use snapscan::snapshot;

const FIXTURE: &str =
    "fixtures/real/Wedsonlin__assignment2-systems__medium_512_training_memory_snapshot.pickle";

fn data() -> Vec<u8> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(FIXTURE);
    std::fs::read(path).expect("fixture")
}

fn reader(c: &mut Criterion) {
    let data = data();
    let mut g = c.benchmark_group("reader");
    g.throughput(Throughput::Bytes(data.len() as u64));
    g.bench_function("parallel (snapshot model)", |b| {
        b.iter(|| snapshot::load_bytes_parallel(&data).expect("parallel reader"))
    });
    g.bench_function("sequential (document + decoder)", |b| {
        b.iter(|| snapshot::load_bytes_sequential("f", &data).expect("sequential reader"))
    });
    g.bench_function("pickle document only", |b| {
        b.iter(|| snapscan::pickle::parse(&data).expect("pickle"))
    });
    // The count of MEMOIZEs the two-thread reader's helper walks for, in 1 MiB ranges as the
    // reader cuts them, over a real-shaped file named by SNAPSCAN_BENCH_WALK (a replica from
    // bench/run.sh), else in 64 KiB ranges over the fixture (60 of them).
    let (walked, range) = match std::env::var_os("SNAPSCAN_BENCH_WALK") {
        Some(path) => (std::fs::read(path).expect("SNAPSCAN_BENCH_WALK"), 1 << 20),
        None => (data.clone(), 64 << 10),
    };
    g.throughput(Throughput::Bytes(walked.len() as u64));
    g.bench_function("memo walk", |b| {
        b.iter(|| snapscan::pickle::walk_memos(&walked, range).expect("walk"))
    });
    g.finish();
}

fn replay(c: &mut Criterion) {
    let data = data();
    let snap = snapshot::load_bytes("f", &data).expect("fixture loads");
    let mut g = c.benchmark_group("replay");
    g.throughput(Throughput::Bytes(data.len() as u64));
    g.bench_function("replay_device", |b| {
        b.iter(|| {
            snap.devices()
                .into_iter()
                .map(|d| replay_device(&snap, d).events)
                .sum::<usize>()
        })
    });
    g.finish();
}

fn report(c: &mut Criterion) {
    let data = data();
    let snap = snapshot::load_bytes("f", &data).expect("fixture loads");
    let options = ReportOptions::default();
    let mut g = c.benchmark_group("report");
    g.throughput(Throughput::Bytes(data.len() as u64));
    g.bench_function("device_report (every device)", |b| {
        b.iter(|| {
            snap.devices()
                .into_iter()
                .map(|d| device_report(&snap, d, &options).window.events)
                .sum::<u64>()
        })
    });
    g.finish();
}

criterion_group!(benches, reader, replay, report);
criterion_main!(benches);
