//! The caching allocator's size rules (`c10/cuda/CUDACachingAllocator.cpp`), as pure functions.

use super::settings::Settings;

/// `kMinBlockSize`: every block is a multiple of this.
pub const MIN_BLOCK: u64 = 512;
/// `kSmallSize`: the largest rounded request served by the small pool.
pub const SMALL_SIZE: u64 = 1 << 20;
/// `kSmallBuffer`: the small pool's segment (and expandable page) size.
pub const SMALL_BUFFER: u64 = 2 << 20;
/// `kLargeBuffer`: the segment of a mid-size request, and the large expandable page.
pub const LARGE_BUFFER: u64 = 20 << 20;
/// `kMinLargeAlloc`: from here a segment is sized to the request.
pub const MIN_LARGE_ALLOC: u64 = 10 << 20;
/// `kRoundLarge`: large segments are multiples of this.
pub const ROUND_LARGE: u64 = 2 << 20;

/// `round_size`: the block size a request of `n` bytes asks for.
pub fn round_size(n: u64, settings: &Settings) -> u64 {
    if n < MIN_BLOCK {
        return MIN_BLOCK;
    }
    let divisions = settings.divisions_for(n);
    if divisions > 1 && n > MIN_BLOCK.saturating_mul(divisions) {
        return roundup_power2_next_division(n, divisions);
    }
    round_to_blocks(n)
}

/// `round_size` without power-of-two divisions (the default): a multiple of 512, at least 512.
pub fn round_to_blocks(n: u64) -> u64 {
    n.div_ceil(MIN_BLOCK).max(1).saturating_mul(MIN_BLOCK)
}

/// `roundup_power2_next_division`: `n` rounded up to the next of `divisions` equal steps
/// between two powers of two.
fn roundup_power2_next_division(n: u64, divisions: u64) -> u64 {
    if n.is_power_of_two() {
        return n;
    }
    let floor = 1u64 << (63 - n.leading_zeros());
    let step = floor >> (63 - divisions.leading_zeros());
    if step == 0 {
        return floor.saturating_mul(2);
    }
    let down = n & !(step - 1);
    if down == n {
        n
    } else {
        down.saturating_add(step)
    }
}

/// `get_pool`: small pool for rounded requests up to 1 MiB.
pub fn is_small(rounded: u64) -> bool {
    rounded <= SMALL_SIZE
}

/// `get_allocation_size`: the `cudaMalloc` size of a new segment for a rounded request.
pub fn segment_size(rounded: u64, settings: &Settings) -> u64 {
    if rounded <= SMALL_SIZE {
        SMALL_BUFFER
    } else if rounded < MIN_LARGE_ALLOC {
        settings.large_segment_size
    } else {
        rounded.div_ceil(ROUND_LARGE).saturating_mul(ROUND_LARGE)
    }
}

/// The page size an expandable segment of this pool maps (`ExpandableSegment::segment_size_`).
pub fn page_size(small: bool, settings: &Settings) -> u64 {
    if small {
        SMALL_BUFFER
    } else {
        settings.large_segment_size
    }
}

/// `should_split`: whether a block of `block` bytes handed out for `rounded` bytes is split,
/// the remainder staying free.
pub fn should_split(block: u64, rounded: u64, small: bool, settings: &Settings) -> bool {
    let remaining = block.saturating_sub(rounded);
    if small || settings.expandable_segments {
        remaining >= MIN_BLOCK
    } else {
        rounded < settings.max_split() && remaining > SMALL_SIZE
    }
}

/// The two `max_split_size` exclusions of `get_free_block`: a block of `block` bytes that the
/// best fit found for `rounded` bytes is refused when it is oversize for a small request, or
/// too much larger than an oversize request.
pub fn oversize_refused(block: u64, rounded: u64, settings: &Settings) -> bool {
    let max_split = settings.max_split();
    (rounded < max_split && block >= max_split)
        || (rounded >= max_split
            && block >= rounded.saturating_add(settings.max_non_split_rounding))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn rounding_follows_the_allocator() {
        let s = Settings::default();
        assert_eq!(round_size(1, &s), 512);
        assert_eq!(round_size(513, &s), 1024);
        assert_eq!(round_size(3 * MIB + 1, &s), 3 * MIB + 512);
        let four = Settings {
            roundup_power2_divisions: [4; 16],
            ..Default::default()
        };
        // The format doc's example: 1200 MiB with 4 divisions → 1280 MiB.
        assert_eq!(round_size(1200 * MIB, &four), 1280 * MIB);
        assert_eq!(round_size(1024 * MIB, &four), 1024 * MIB);
        // At or below 512 × divisions the default rounding applies.
        assert_eq!(round_size(1500, &four), 1536);
    }

    #[test]
    fn segment_sizes_and_splits() {
        let s = Settings::default();
        assert_eq!(segment_size(MIB, &s), 2 * MIB);
        assert_eq!(segment_size(MIB + 512, &s), 20 * MIB);
        assert_eq!(segment_size(10 * MIB, &s), 10 * MIB);
        assert_eq!(segment_size(11 * MIB + 1, &s), 12 * MIB);
        // Large pool: a remainder of exactly 1 MiB is not split, one byte more is.
        assert!(!should_split(4 * MIB, 3 * MIB, false, &s));
        assert!(should_split(4 * MIB + 512, 3 * MIB, false, &s));
        assert!(should_split(2 * MIB, 2 * MIB - 512, true, &s));
        let m = Settings {
            max_split_size: Some(64 * MIB),
            ..Default::default()
        };
        assert!(oversize_refused(64 * MIB, 2 * MIB, &m));
        assert!(!oversize_refused(80 * MIB, 64 * MIB, &m));
        assert!(oversize_refused(84 * MIB, 64 * MIB, &m));
        assert!(!should_split(200 * MIB, 100 * MIB, false, &m));
    }
}
