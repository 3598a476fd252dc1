//! Snapshots analysed once and kept: by path, modification time and length (a file rewritten
//! in place is analysed again), the least recently used dropped first when the kept ones
//! would pass the memory budget. An analysis bigger than the whole budget answers its call and
//! is not kept.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::SystemTime;

use crate::analysis::report::{file_report_keeping, DeviceParts, ReportOptions};
use crate::report::{FileReport, JSON_LIST_LIMIT};
use crate::snapshot::LoadedSnapshot;

/// One snapshot as the server keeps it.
pub(crate) struct Analysed {
    pub loaded: LoadedSnapshot,
    /// The report as `snapscan report --format json` makes it (lists capped alike).
    pub report: FileReport,
    /// What each device's report was made from: live sets and lives at any event.
    pub parts: Vec<DeviceParts>,
    /// The uncapped report (`diff` and `check` read it, as the CLI's do), made on first use.
    pub full_report: OnceLock<FileReport>,
    /// The snapshot's SQL store, built in memory on the first `query`.
    pub database: OnceLock<Result<Mutex<rusqlite::Connection>, String>>,
    /// That store's bytes, charged against the budget with the rest once it exists.
    pub database_bytes: std::sync::atomic::AtomicU64,
    /// The last segment layout `segments_at` made (device, moment): its next pages, and the
    /// same question again, are read from it (a layout at 1 GB takes about 0.2 s).
    pub last_layout: Mutex<Option<LastLayout>>,
    /// Per device (as `parts`): every allocation's category claim and the user's annotations,
    /// made on the first `allocation` call (the categorizer's pass over the births took 0.2-0.4 s
    /// a call on a 1 GB dump), and their bytes, charged against the budget.
    pub claims: Vec<OnceLock<DeviceClaims>>,
    /// Per device (as `parts`): every segment's life over the trace, made on the first
    /// `segments_at` call, so that a new moment's segments are a filter, not the trace's
    /// segment events undone again (a 1 GB dump has 280,000 segments).
    pub segment_lives: Vec<OnceLock<Vec<crate::analysis::layout::SegmentLife>>>,
    /// The bytes of the claims and segment lives made so far, charged against the budget.
    pub derived_bytes: std::sync::atomic::AtomicU64,
}

/// The claims of one device's allocations, in the order of its replay's allocations.
pub(crate) struct DeviceClaims {
    pub claims: Vec<crate::analysis::category::Claim>,
    pub annotations: crate::analysis::annotations::UserAnnotations,
}

pub(crate) type LastLayout = ((i64, crate::analysis::layout::Moment), Arc<SegmentsByFree>);

/// A moment's segment layouts in address order, and their indices most free bytes first (the
/// order `segments_at` pages through).
pub(crate) struct SegmentsByFree {
    pub layouts: Vec<crate::analysis::layout::SegmentLayout>,
    pub most_free_first: Vec<u32>,
}

impl Entry {
    fn charged(&self) -> u64 {
        self.cost.saturating_add(
            self.value
                .database_bytes
                .load(std::sync::atomic::Ordering::Relaxed)
                .saturating_add(
                    self.value
                        .derived_bytes
                        .load(std::sync::atomic::Ordering::Relaxed),
                ),
        )
    }
}

impl Analysed {
    /// Which of `self.parts` a device's `parts` are (they are borrowed from it).
    fn index_of(&self, parts: &DeviceParts) -> usize {
        self.parts
            .iter()
            .position(|p| std::ptr::eq(p, parts))
            .unwrap_or(0)
    }

    /// The claims of the allocations of a device (its `parts`), made once.
    pub fn claims(&self, parts: &DeviceParts) -> &DeviceClaims {
        let i = self.index_of(parts);
        self.claims[i].get_or_init(|| {
            use rayon::prelude::*;
            let parts = &self.parts[i];
            let mut categorizer = crate::analysis::category::Categorizer::new(
                &self.loaded.snapshot,
                &parts.phases,
                &parts.replay,
            );
            let claims: Vec<_> = parts
                .replay
                .allocations
                .as_slice()
                .par_iter()
                .map(|x| categorizer.claim(x))
                .collect();
            let bytes = std::mem::size_of_val(claims.as_slice()) as u64;
            self.derived_bytes
                .fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
            DeviceClaims {
                claims,
                annotations: std::mem::take(&mut categorizer.annotations),
            }
        })
    }

    /// The segment lives of a device (its `parts`), made once.
    pub fn segment_lives(&self, parts: &DeviceParts) -> &[crate::analysis::layout::SegmentLife] {
        let i = self.index_of(parts);
        self.segment_lives[i].get_or_init(|| {
            let lives = crate::analysis::layout::segment_lifetimes(
                &self.loaded.snapshot,
                &self.parts[i].replay,
            );
            let bytes = std::mem::size_of_val(lives.as_slice()) as u64;
            self.derived_bytes
                .fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
            lives
        })
    }

    pub fn full_report(&self) -> &FileReport {
        self.full_report.get_or_init(|| {
            crate::analysis::report::file_report(&self.loaded, &ReportOptions::default())
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Key {
    path: PathBuf,
    modified: Option<SystemTime>,
    len: u64,
}

struct Entry {
    key: Key,
    value: Arc<Analysed>,
    /// Bytes charged against the budget: the decoded snapshot's size, which bounds what its
    /// typed model, replay and report take (a 1 GB pickle: about 0.4 GB of them).
    cost: u64,
    last_used: u64,
}

pub(crate) struct Cache {
    budget: u64,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    entries: Vec<Entry>,
    clock: u64,
}

impl Cache {
    pub fn new(budget: u64) -> Cache {
        Cache {
            budget,
            inner: Mutex::new(Inner::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The analysed snapshot at `path` (a resolved path under the roots).
    pub fn get(&self, path: &Path) -> Result<Arc<Analysed>, String> {
        let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let key = Key {
            path: path.to_path_buf(),
            modified: meta.modified().ok(),
            len: meta.len(),
        };
        {
            let mut inner = self.lock();
            inner.clock += 1;
            let now = inner.clock;
            if let Some(e) = inner.entries.iter_mut().find(|e| e.key == key) {
                e.last_used = now;
                return Ok(e.value.clone());
            }
        }
        // Analysed outside the lock: other calls go on meanwhile.
        let loaded = crate::snapshot::load(path).map_err(|e| format!("{e:#}"))?;
        let options = ReportOptions {
            list_limit: Some(JSON_LIST_LIMIT),
            ..Default::default()
        };
        let (report, parts) = file_report_keeping(&loaded, &options);
        let parts_len = parts.len();
        let cost = loaded.decoded_bytes.max(1);
        let value = Arc::new(Analysed {
            loaded,
            report,
            parts,
            full_report: OnceLock::new(),
            database: OnceLock::new(),
            database_bytes: Default::default(),
            last_layout: Mutex::new(None),
            claims: (0..parts_len).map(|_| OnceLock::new()).collect(),
            segment_lives: (0..parts_len).map(|_| OnceLock::new()).collect(),
            derived_bytes: Default::default(),
        });
        let mut inner = self.lock();
        inner.clock += 1;
        let now = inner.clock;
        // An older version of the file goes.
        inner.entries.retain(|e| e.key.path != key.path);
        if cost <= self.budget {
            // The new entry is the most recent: the oldest go first, it goes last.
            inner.entries.push(Entry {
                key,
                value: value.clone(),
                cost,
                last_used: now,
            });
            while inner.entries.iter().map(Entry::charged).sum::<u64>() > self.budget {
                let oldest = inner
                    .entries
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, e)| e.last_used)
                    .map(|(i, _)| i);
                match oldest {
                    Some(i) => drop(inner.entries.remove(i)),
                    None => break,
                }
            }
        }
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(rel: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures")
            .join(rel)
    }

    impl Cache {
        fn kept(&self) -> Vec<PathBuf> {
            self.lock()
                .entries
                .iter()
                .map(|e| e.key.path.clone())
                .collect()
        }
    }

    #[test]
    fn the_least_recently_used_snapshot_goes_when_the_budget_is_passed() {
        let a = fixture("captured/oom_backward.pickle");
        let b = fixture("captured/fragmentation_oom.pickle");
        let size = |p: &Path| crate::snapshot::load(p).unwrap().decoded_bytes;
        let cache = Cache::new(size(&a).max(size(&b)) + 1);
        let first = cache.get(&a).unwrap();
        // The same file again is the kept analysis, not a new one.
        assert!(Arc::ptr_eq(&first, &cache.get(&a).unwrap()));
        cache.get(&b).unwrap();
        assert_eq!(cache.kept(), vec![b.clone()]);
        // A budget smaller than one snapshot answers and keeps nothing.
        let tiny = Cache::new(1);
        assert!(!tiny.get(&a).unwrap().report.devices.is_empty());
        assert!(tiny.kept().is_empty());
        // A missing file is named.
        let missing = fixture("captured/no-such.pickle");
        let error = cache.get(&missing).err().expect("an error");
        assert!(error.contains("no-such.pickle"), "{error}");
    }
}
