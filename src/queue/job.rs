//! What goes into a work queue ([`Job`]) and what comes out ([`Entry`]).

use bytes::Bytes;

/// A unit of work: named fields, binary-safe. [`QueueLayer`](super::QueueLayer)
/// fills `key`, `method`, `uri`, `content-type` (when sent) and `body`.
///
/// ```
/// use tollgate::queue::Job;
/// let job = Job::new().field("zone", "big cats").field("body", vec![0u8, 159]);
/// assert_eq!(job.get_str("zone"), Some("big cats"));
/// assert_eq!(job.get("body"), Some(&[0u8, 159][..]));
/// assert_eq!(job.get_str("body"), None, "not UTF-8");
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Job {
    fields: Vec<(String, Bytes)>,
}

impl Job {
    /// A job without fields.
    ///
    /// ```
    /// use tollgate::queue::Job;
    /// let job = Job::new();
    /// assert!(job.fields().is_empty());
    /// assert_eq!(job, Job::default());
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a field (names may repeat; [`get`](Self::get) finds the first).
    pub fn field(mut self, name: impl Into<String>, value: impl Into<Bytes>) -> Self {
        self.fields.push((name.into(), value.into()));
        self
    }

    /// The first field called `name`.
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_ref())
    }

    /// The first field called `name`, if it is UTF-8.
    pub fn get_str(&self, name: &str) -> Option<&str> {
        self.get(name).and_then(|v| std::str::from_utf8(v).ok())
    }

    /// All fields, in order.
    pub fn fields(&self) -> &[(String, Bytes)] {
        &self.fields
    }

    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    /// A list element: netstrings (`len:bytes,`) of name, value, name, value.
    /// Binary-safe, and simple to read in any language.
    pub(crate) fn encode(&self, id: &str) -> Vec<u8> {
        let mut out = Vec::new();
        let mut put = |b: &[u8]| {
            out.extend_from_slice(b.len().to_string().as_bytes());
            out.push(b':');
            out.extend_from_slice(b);
            out.push(b',');
        };
        put(b"id");
        put(id.as_bytes());
        for (name, value) in &self.fields {
            put(name.as_bytes());
            put(value);
        }
        out
    }

    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    /// Reads what [`encode`](Self::encode) wrote: the id and the job.
    pub(crate) fn decode(mut raw: &[u8]) -> Option<(String, Job)> {
        let mut id = None;
        let mut job = Job::new();
        while !raw.is_empty() {
            let name = netstring(&mut raw)?;
            let value = netstring(&mut raw)?;
            let name = String::from_utf8(name.to_vec()).ok()?;
            if id.is_none() && name == "id" {
                id = Some(String::from_utf8(value.to_vec()).ok()?);
            } else {
                job = job.field(name, Bytes::copy_from_slice(value));
            }
        }
        Some((id?, job))
    }
}

#[cfg_attr(not(feature = "redis"), allow(dead_code))]
/// Takes one netstring (`len:bytes,`) off the front of `raw`.
fn netstring<'a>(raw: &mut &'a [u8]) -> Option<&'a [u8]> {
    let colon = raw.iter().take(20).position(|&b| b == b':')?;
    let len: usize = std::str::from_utf8(&raw[..colon]).ok()?.parse().ok()?;
    let rest = &raw[colon + 1..];
    if rest.len() <= len || rest[len] != b',' {
        return None;
    }
    *raw = &rest[len + 1..];
    Some(&rest[..len])
}

/// A job taken out of a queue, with the id it was given when pushed.
///
/// ```
/// use tollgate::queue::{Entry, Job};
/// let e = Entry::new("1-0", Job::new().field("a", "b"));
/// assert_eq!(e.id, "1-0");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Entry {
    /// The id [`Pushed::id`](super::Pushed::id) reported.
    pub id: String,
    /// The fields pushed.
    pub job: Job,
}

impl Entry {
    /// An entry `id` holding `job`.
    ///
    /// ```
    /// use tollgate::queue::{Entry, Job};
    /// let entry = Entry::new("1700000000000-0", Job::new().field("zone", "reptiles"));
    /// assert_eq!(entry.id, "1700000000000-0");
    /// assert_eq!(entry.job.get_str("zone"), Some("reptiles"));
    /// ```
    pub fn new(id: impl Into<String>, job: Job) -> Self {
        Self { id: id.into(), job }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_elements_round_trip_binary_fields() {
        let job = Job::new()
            .field("body", vec![b',', b':', 0, 255])
            .field("", "")
            .field("id", "not the id");
        let raw = job.encode("42");
        assert_eq!(Job::decode(&raw), Some(("42".to_owned(), job)));
        assert_eq!(Job::decode(b"2:id,2:42,4:bo"), None, "truncated");
        assert_eq!(Job::decode(b"garbage"), None);
    }
}
