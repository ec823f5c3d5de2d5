//! Header values for the numbers a response carries, made without
//! allocating per response: numbers under 10,000 are slices of one static
//! table, larger ones slices of a per-thread arena, and the reset second
//! is built once per second.

use std::cell::RefCell;

use bytes::{Bytes, BytesMut};
use http::header::HeaderValue;

/// `n` in decimal as a header value.
pub(super) fn number(n: u64) -> HeaderValue {
    match small(n) {
        // Digits only: `from_static`'s check of each byte always passes.
        Some(digits) => HeaderValue::from_static(digits),
        None => cut_from_arena(n),
    }
}

/// `n` as a header value kept for a layer's life (a quota's limit): from
/// the table, or a buffer of its own rather than an arena slice, which
/// would keep the whole chunk alive as long.
pub(super) fn kept_number(n: u64) -> HeaderValue {
    match small(n) {
        Some(digits) => HeaderValue::from_static(digits),
        None => shared(itoa::Buffer::new().format(n)),
    }
}

/// A header value of `text`, which the caller knows is valid, built once
/// (a policy's name): clones share its buffer (a reference count, no copy).
pub(super) fn shared(text: &str) -> HeaderValue {
    checked(Bytes::copy_from_slice(text.as_bytes()))
}

/// `bytes` as a header value; never fails for the digits and names given.
fn checked(bytes: Bytes) -> HeaderValue {
    HeaderValue::from_maybe_shared(bytes).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// Numbers below this are slices of [`SMALL`]: every count of a quota of
/// up to 9,999, and a `Retry-After` under two and three-quarter hours.
/// Neither making the value nor cloning or dropping it allocates or
/// touches a reference count.
const SMALL_BELOW: usize = 10_000;

/// The digits of 0 to 9,999 back to back: "0123456789101112…9999".
static SMALL: &str = match std::str::from_utf8(&SMALL_DIGITS) {
    Ok(digits) => digits,
    Err(_) => panic!("the table holds only ASCII digits"),
};

/// 10 one-digit numbers, 90 of two digits, 900 of three, 9,000 of four.
const SMALL_LEN: usize = 10 + 90 * 2 + 900 * 3 + 9_000 * 4;

/// Written at compile time.
static SMALL_DIGITS: [u8; SMALL_LEN] = {
    let mut table = [0; SMALL_LEN];
    let (mut n, mut at) = (0, 0);
    while n < SMALL_BELOW {
        let width = digit_count(n);
        let (mut rest, mut i) = (n, width);
        while i > 0 {
            i -= 1;
            table[at + i] = b'0' + (rest % 10) as u8;
            rest /= 10;
        }
        at += width;
        n += 1;
    }
    table
};

const fn digit_count(n: usize) -> usize {
    match n {
        0..=9 => 1,
        10..=99 => 2,
        100..=999 => 3,
        _ => 4,
    }
}

/// `n`'s digits in [`SMALL`], when `n` is below [`SMALL_BELOW`]: where
/// they start follows from how many shorter numbers come before.
fn small(n: u64) -> Option<&'static str> {
    let n = usize::try_from(n).ok().filter(|n| *n < SMALL_BELOW)?;
    let start = match n {
        0..=9 => n,
        10..=99 => 10 + (n - 10) * 2,
        100..=999 => 190 + (n - 100) * 3,
        _ => 2_890 + (n - 1_000) * 4,
    };
    SMALL.get(start..start + digit_count(n))
}

thread_local! {
    /// The last `X-RateLimit-Reset` this thread wrote, with its value: a
    /// window's responses share one reset second (a fixed window's for the
    /// whole window), so it is built once per second, not per response.
    static LAST_RESET: RefCell<Option<(u64, HeaderValue)>> = const { RefCell::new(None) };
}

/// `secs` as a header value, reusing the last one built when it is the same.
pub(super) fn reset_value(secs: u64) -> HeaderValue {
    LAST_RESET.with_borrow_mut(|last| match last {
        Some((last, value)) if *last == secs => value.clone(),
        _ => last.insert((secs, number(secs))).1.clone(),
    })
}

/// Bytes of header digits carved per allocation: over a hundred responses.
const ARENA_BYTES: usize = 4096;

/// The most digits a `u64` has.
const U64_DIGITS: usize = 20;

thread_local! {
    /// Where this thread writes the digits of numbers too large for
    /// [`SMALL`]. Each value shares its chunk by reference count; a chunk
    /// is freed when the last value cut from it is gone, and replaced when
    /// it runs short.
    static ARENA: RefCell<BytesMut> = RefCell::new(BytesMut::new());
}

/// `n` in decimal, a slice of this thread's arena.
fn cut_from_arena(n: u64) -> HeaderValue {
    let digits = ARENA.with_borrow_mut(|arena| {
        if arena.capacity() - arena.len() < U64_DIGITS {
            *arena = BytesMut::with_capacity(ARENA_BYTES);
        }
        arena.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
        arena.split().freeze()
    });
    checked(digits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_small_number_reads_as_display_writes_it() {
        for n in 0..SMALL_BELOW as u64 {
            assert_eq!(small(n), Some(n.to_string().as_str()));
            assert_eq!(number(n).as_bytes(), n.to_string().as_bytes());
        }
        for n in [0, 9_999, 10_000, u64::MAX] {
            assert_eq!(kept_number(n).as_bytes(), n.to_string().as_bytes());
        }
        assert_eq!(small(SMALL_BELOW as u64), None);
        assert_eq!(small(u64::MAX), None);
    }

    #[test]
    fn a_reset_value_is_rebuilt_exactly_when_the_second_changes() {
        for secs in [
            1_795_000_000,
            1_795_000_000,
            1_795_000_001,
            0,
            0,
            u64::MAX,
            u64::MAX,
        ] {
            assert_eq!(reset_value(secs).as_bytes(), secs.to_string().as_bytes());
        }
        // The same second shares one buffer; the next second has its own.
        let (a, b) = (reset_value(1_795_000_007), reset_value(1_795_000_007));
        assert_eq!(a.as_bytes().as_ptr(), b.as_bytes().as_ptr());
        assert_eq!(reset_value(8).as_bytes(), b"8");
    }

    #[test]
    fn numbers_cut_from_the_arena_stay_intact_across_chunks() {
        // Enough values to fill several chunks; every value is kept
        // alive, so later chunks must never write over earlier ones.
        let kept: Vec<_> = (0..1_000u64)
            .map(|i| {
                let ns = [SMALL_BELOW as u64 + i, u64::MAX - i, 1_795_000_000 + i];
                (ns, ns.map(number))
            })
            .collect();
        for (ns, values) in kept {
            for (n, value) in ns.into_iter().zip(values) {
                assert_eq!(value.as_bytes(), n.to_string().as_bytes());
            }
        }
    }
}
