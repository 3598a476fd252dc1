//! The allocator's settings: read from the dump's `allocator_settings` (and its
//! `PYTORCH_CUDA_ALLOC_CONF` text), overridden with the same syntax.

use serde::Serialize;

use super::rules::LARGE_BUFFER;
use crate::snapshot::Snapshot;

const MIB: u64 = 1 << 20;

/// What the model follows. `max_split_size: None` is unlimited (`SIZE_MAX`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Settings {
    pub expandable_segments: bool,
    pub max_split_size: Option<u64>,
    /// `max_non_split_rounding_mb` (2.6+), bytes: how much larger than an oversize request a
    /// cached oversize block may be and still serve it.
    pub max_non_split_rounding: u64,
    /// `roundup_power2_divisions` per interval: index `i` covers requests of [2^i, 2^(i+1)) MiB
    /// (the first also below 1 MiB, the last also above); 0 or 1 = off.
    pub roundup_power2_divisions: [u64; 16],
    /// Only active with a per-process memory fraction, which the dump does not record.
    pub garbage_collection_threshold: f64,
    /// `large_segment_size_mb`: the segment of a mid-size request and the large expandable page.
    pub large_segment_size: u64,
    /// Where the settings came from: `default`, `dump`, and `override` when any was set.
    pub source: &'static str,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            expandable_segments: false,
            max_split_size: None,
            max_non_split_rounding: LARGE_BUFFER,
            roundup_power2_divisions: [0; 16],
            garbage_collection_threshold: 0.0,
            large_segment_size: LARGE_BUFFER,
            source: "default",
        }
    }
}

/// A setting that cannot be followed: named, never ignored.
#[derive(Debug, thiserror::Error)]
#[error("allocator setting `{key}`: {reason}")]
pub struct SettingsError {
    pub key: String,
    pub reason: String,
}

fn refuse(key: &str, reason: impl Into<String>) -> SettingsError {
    SettingsError {
        key: key.to_owned(),
        reason: reason.into(),
    }
}

impl Settings {
    /// `max_split_size` as the allocator compares it (`SIZE_MAX` when unlimited).
    pub fn max_split(&self) -> u64 {
        self.max_split_size.unwrap_or(u64::MAX)
    }

    /// `AllocatorConfig::roundup_power2_divisions(size)`.
    pub fn divisions_for(&self, n: u64) -> u64 {
        let log = 63 - n.max(1).leading_zeros() as usize;
        let index = log.saturating_sub(20).min(15);
        self.roundup_power2_divisions[index]
    }

    /// The settings the dump recorded, with expandable segments also inferred from the
    /// segments of files older than `allocator_settings` (2.3). Keys of the recorded
    /// configuration text that the model does not follow are returned as notes.
    pub fn from_snapshot(snapshot: &Snapshot) -> (Settings, Vec<String>) {
        let mut s = Settings::default();
        let mut notes = Vec::new();
        if let Some(a) = &snapshot.allocator_settings {
            s.source = "dump";
            s.expandable_segments = a.expandable_segments.unwrap_or(false);
            s.max_split_size = a.max_split_size;
            s.garbage_collection_threshold = a.garbage_collection_threshold.unwrap_or(0.0);
            if let Some(obj) = a
                .raw
                .get("roundup_power2_divisions")
                .and_then(|v| v.as_object())
            {
                for (k, v) in obj {
                    let (Ok(mib), Some(d)) = (k.parse::<u64>(), v.as_u64()) else {
                        continue;
                    };
                    if mib.is_power_of_two() {
                        let i = mib.trailing_zeros() as usize;
                        if i < 16 {
                            s.roundup_power2_divisions[i] = d;
                        }
                    }
                }
            }
            // Knobs visible only in the configuration text.
            if let Some(conf) = a.conf.as_deref() {
                for item in split_conf(conf) {
                    let Some((key, value)) = item.split_once(':') else {
                        continue;
                    };
                    let key = key.trim();
                    if matches!(key, "max_non_split_rounding_mb" | "large_segment_size_mb") {
                        // The value is the dump's text: not repeated in the note.
                        if s.set(key, value.trim()).is_err() {
                            notes.push(format!(
                                "the dump's {key} is not a size the allocator accepts: the default is used"
                            ));
                        }
                    } else if key == "backend" && value.trim() == "cudaMallocAsync" {
                        notes.push(
                            "the dump was made with backend:cudaMallocAsync, a different \
                             allocator: the caching allocator's rules do not apply"
                                .to_owned(),
                        );
                    }
                }
            }
        }
        if !s.expandable_segments {
            let device_has_expandable = snapshot.segments.iter().any(|g| g.is_expandable);
            if device_has_expandable {
                s.expandable_segments = true;
                notes.push(
                    "expandable segments inferred from the dump's segments (no allocator_settings)"
                        .to_owned(),
                );
            }
        }
        (s, notes)
    }

    /// Applies `PYTORCH_CUDA_ALLOC_CONF` text (`key:value,key:value`), refusing by name any
    /// key the model does not implement.
    pub fn apply_conf(&mut self, conf: &str) -> Result<(), SettingsError> {
        for item in split_conf(conf) {
            let (key, value) = item
                .split_once(':')
                .ok_or_else(|| refuse(item.trim(), "expected key:value"))?;
            self.set(key.trim(), value.trim())?;
        }
        self.source = "override";
        Ok(())
    }

    fn set(&mut self, key: &str, value: &str) -> Result<(), SettingsError> {
        let mib = |v: &str| -> Result<u64, SettingsError> {
            v.parse::<u64>()
                .map_err(|_| refuse(key, format!("expected a whole number of MiB, got `{v}`")))
                .map(|m| m.saturating_mul(MIB))
        };
        let flag = |v: &str| -> Result<bool, SettingsError> {
            match v {
                "True" | "true" | "1" => Ok(true),
                "False" | "false" | "0" => Ok(false),
                _ => Err(refuse(key, format!("expected True or False, got `{v}`"))),
            }
        };
        match key {
            "expandable_segments" => self.expandable_segments = flag(value)?,
            "max_split_size_mb" => {
                let m = mib(value)?;
                // CUDAAllocatorConfig: at least kLargeBuffer.
                if m < LARGE_BUFFER {
                    return Err(refuse(key, "must be at least 20 (MiB)"));
                }
                self.max_split_size = Some(m);
            }
            "max_non_split_rounding_mb" => self.max_non_split_rounding = mib(value)?,
            "large_segment_size_mb" => {
                let m = mib(value)?;
                if m == 0 || m % (2 * MIB) != 0 {
                    return Err(refuse(key, "must be a positive multiple of 2 (MiB)"));
                }
                self.large_segment_size = m;
            }
            "garbage_collection_threshold" => {
                let t: f64 = value
                    .parse()
                    .map_err(|_| refuse(key, format!("expected a number, got `{value}`")))?;
                if !(t > 0.0 && t < 1.0) {
                    return Err(refuse(key, "must be between 0 and 1 (exclusive)"));
                }
                self.garbage_collection_threshold = t;
            }
            "roundup_power2_divisions" => self.roundup_power2_divisions = divisions(value)?,
            // No effect on where blocks go (format doc §9.8).
            "release_lock_on_cudamalloc" => {
                flag(value)?;
            }
            "backend" => {
                if value != "native" {
                    return Err(refuse(
                        key,
                        format!("`{value}` is not the caching allocator this model follows"),
                    ));
                }
            }
            _ => {
                return Err(refuse(
                    key,
                    "not implemented by the allocator model (it follows expandable_segments, \
                     max_split_size_mb, max_non_split_rounding_mb, roundup_power2_divisions, \
                     garbage_collection_threshold, large_segment_size_mb, \
                     release_lock_on_cudamalloc)",
                ))
            }
        }
        Ok(())
    }

    /// One line: every setting that differs from the defaults, or "defaults".
    pub fn describe(&self) -> String {
        let mut parts = vec![format!(
            "expandable_segments:{}",
            if self.expandable_segments {
                "True"
            } else {
                "False"
            }
        )];
        parts.push(match self.max_split_size {
            Some(m) => format!("max_split_size_mb:{}", m / MIB),
            None => "max_split_size_mb:unlimited".to_owned(),
        });
        if self.max_non_split_rounding != LARGE_BUFFER {
            parts.push(format!(
                "max_non_split_rounding_mb:{}",
                self.max_non_split_rounding / MIB
            ));
        }
        if self.roundup_power2_divisions.iter().any(|&d| d > 1) {
            let list: Vec<String> = self
                .roundup_power2_divisions
                .iter()
                .enumerate()
                .map(|(i, d)| format!("{}:{d}", 1u64 << i))
                .collect();
            parts.push(format!("roundup_power2_divisions:[{}]", list.join(",")));
        }
        if self.garbage_collection_threshold > 0.0 {
            parts.push(format!(
                "garbage_collection_threshold:{}",
                self.garbage_collection_threshold
            ));
        }
        if self.large_segment_size != LARGE_BUFFER {
            parts.push(format!(
                "large_segment_size_mb:{}",
                self.large_segment_size / MIB
            ));
        }
        parts.join(",")
    }
}

/// Items of a configuration text, with commas inside `[...]` kept in their item.
fn split_conf(conf: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in conf.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth <= 0 => {
                out.push(&conf[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&conf[start..]);
    out.into_iter().filter(|s| !s.trim().is_empty()).collect()
}

/// `roundup_power2_divisions:N` or `[256:1,512:2,>:4]` (interval starts in MiB), as
/// `CUDAAllocatorConfig::parseRoundUpPower2Divisions` reads them.
fn divisions(value: &str) -> Result<[u64; 16], SettingsError> {
    let key = "roundup_power2_divisions";
    let mut out = [0u64; 16];
    let check = |d: u64| -> Result<u64, SettingsError> {
        if d == 0 || d.is_power_of_two() {
            Ok(d)
        } else {
            Err(refuse(
                key,
                format!("divisions must be a power of two, got {d}"),
            ))
        }
    };
    let Some(list) = value.strip_prefix('[').and_then(|v| v.strip_suffix(']')) else {
        let d = value.parse::<u64>().map_err(|_| {
            refuse(
                key,
                format!("expected a number or a [..] list, got `{value}`"),
            )
        })?;
        return Ok([check(d)?; 16]);
    };
    let mut last: Option<usize> = None;
    for item in list.split(',').filter(|s| !s.trim().is_empty()) {
        let (k, v) = item
            .split_once(':')
            .ok_or_else(|| refuse(key, format!("expected interval:divisions, got `{item}`")))?;
        let d = check(
            v.trim()
                .parse::<u64>()
                .map_err(|_| refuse(key, format!("expected a number, got `{v}`")))?,
        )?;
        if k.trim() == ">" {
            let from = last.map_or(0, |l| l + 1);
            out[from.min(16)..].fill(d);
            continue;
        }
        let mib = k
            .trim()
            .parse::<u64>()
            .map_err(|_| refuse(key, format!("expected an interval in MiB, got `{k}`")))?;
        if !mib.is_power_of_two() {
            return Err(refuse(key, format!("interval {mib} is not a power of two")));
        }
        let i = (mib.trailing_zeros() as usize).min(15);
        if last.is_none() {
            out[..i].fill(d);
        }
        out[i] = d;
        last = Some(i);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conf_text_is_read_and_unknown_keys_refused() {
        let mut s = Settings::default();
        s.apply_conf("expandable_segments:True,max_split_size_mb:256")
            .unwrap();
        assert!(s.expandable_segments);
        assert_eq!(s.max_split_size, Some(256 * MIB));
        s.apply_conf("roundup_power2_divisions:[256:1,512:2,>:4]")
            .unwrap();
        assert_eq!(s.roundup_power2_divisions[..8], [1, 1, 1, 1, 1, 1, 1, 1]);
        assert_eq!(s.roundup_power2_divisions[8], 1);
        assert_eq!(s.roundup_power2_divisions[9], 2);
        assert_eq!(s.roundup_power2_divisions[10..], [4; 6]);
        let e = s.apply_conf("pinned_num_register_threads:8").unwrap_err();
        assert_eq!(e.key, "pinned_num_register_threads");
        assert!(s.apply_conf("max_split_size_mb:10").is_err());
        assert!(s.apply_conf("roundup_power2_divisions:3").is_err());
    }
}
