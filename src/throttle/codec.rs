//! A filter's bit array on the wire: little-endian 64-bit words, LZ4-compressed
//! when that is smaller.
//!
//! Early in a minute a filter is sparse and compresses well; near capacity its
//! bits are close to random and LZ4 would only add a few bytes, so the array is
//! then sent raw. The first byte says which.

/// The array follows as is.
const RAW: u8 = 0;
/// The array follows as an LZ4 block.
const LZ4: u8 = 1;

/// Why stored bits could not be read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DecodeError {
    /// Unknown tag byte, corrupt LZ4, or a length that is not `words * 8`:
    /// usually another app server configured with a different filter size.
    Shape(String),
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::Shape(why) => write!(f, "stored bloom filter unusable: {why}"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// Encodes `words` (a filter's bit array) for storage.
pub(crate) fn encode(words: impl Iterator<Item = u64>) -> Vec<u8> {
    let raw: Vec<u8> = words.flat_map(u64::to_le_bytes).collect();
    let packed = lz4_flex::compress(&raw);
    let (tag, body) = if packed.len() < raw.len() {
        (LZ4, packed)
    } else {
        (RAW, raw)
    };
    let mut out = Vec::with_capacity(body.len() + 1);
    out.push(tag);
    out.extend_from_slice(&body);
    out
}

/// Decodes what [`encode`] wrote, insisting on exactly `words` words, so that a
/// corrupt or foreign value can neither allocate without bound nor be merged
/// into a filter of another size.
pub(crate) fn decode(bytes: &[u8], words: usize) -> Result<Vec<u64>, DecodeError> {
    let len = words * 8;
    let (tag, body) = bytes
        .split_first()
        .ok_or_else(|| DecodeError::Shape("empty value".into()))?;
    let raw = match *tag {
        RAW if body.len() == len => body.to_vec(),
        RAW => {
            return Err(DecodeError::Shape(format!(
                "{} bytes of bits, expected {len}",
                body.len()
            )))
        }
        LZ4 => {
            let mut out = vec![0u8; len];
            match lz4_flex::decompress_into(body, &mut out) {
                Ok(n) if n == len => out,
                Ok(n) => {
                    return Err(DecodeError::Shape(format!(
                        "{n} bytes of bits, expected {len}"
                    )))
                }
                Err(err) => return Err(DecodeError::Shape(err.to_string())),
            }
        }
        other => return Err(DecodeError::Shape(format!("unknown encoding {other}"))),
    };
    Ok(raw
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("chunks of 8")))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_arrays_compress_and_round_trip() {
        let mut words = vec![0u64; 4096];
        words[17] = 0xdead_beef;
        words[4000] = u64::MAX;
        let bytes = encode(words.iter().copied());
        assert_eq!(bytes[0], LZ4);
        assert!(bytes.len() < 1000, "{} bytes", bytes.len());
        assert_eq!(decode(&bytes, 4096).unwrap(), words);
    }

    #[test]
    fn dense_random_arrays_go_raw_and_round_trip() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let words: Vec<u64> = (0..512)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            })
            .collect();
        let bytes = encode(words.iter().copied());
        assert_eq!(bytes[0], RAW);
        assert_eq!(bytes.len(), 512 * 8 + 1);
        assert_eq!(decode(&bytes, 512).unwrap(), words);
    }

    #[test]
    fn foreign_shapes_and_garbage_are_errors_not_panics() {
        let bytes = encode([1u64, 2, 3].into_iter());
        assert!(decode(&bytes, 4).is_err());
        assert!(decode(&[], 4).is_err());
        assert!(decode(&[9, 1, 2], 4).is_err());
        assert!(decode(&[LZ4, 0xff, 0xff, 0xff], 4).is_err());
    }
}
