//! The texts of cached objects, deflated against the first object of their kind.
//!
//! Objects of one kind in one controller's caches are nearly the same text: the same
//! field names, the same condition types and reasons, the same labels and images, only
//! names, uids and timestamps differ. Deflate (RFC 1951) with a preset dictionary, the
//! text of an earlier object of the kind, finds those long repeats in the dictionary: a
//! ModelDeployment of 1.4 kB with its status comes to under 110 bytes (about 470 deflated
//! alone). The first object of a kind this process keeps is its dictionary, until a text
//! more than a quarter longer comes (the first ModelDeployment a controller sees is often
//! a new one, without the status most will have): that one becomes the dictionary of the
//! texts after it. Each text holds the dictionary it was deflated against (an `Arc`), so
//! nothing depends on which objects came first except how well the others compress.
//!
//! The deflate and inflate states (a few hundred kB for deflate's window and hash chains)
//! are kept per thread and reset for each text rather than allocated for each.

use std::cell::RefCell;
use std::sync::{Arc, Mutex, OnceLock};

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

/// The longest dictionary kept: deflate looks back 32 kB at most, and a kind's first
/// object is rarely larger than a few kB.
const MAX_DICTIONARY: usize = 16 * 1024;

/// A text deflated against its kind's dictionary.
#[derive(Clone)]
pub(super) struct Squeezed {
    dictionary: Arc<[u8]>,
    deflated: Box<[u8]>,
    /// The text's length, for the buffer it is inflated into.
    len: u32,
}

/// Why a text could not be deflated or inflated again (a bug: the states are only ever
/// given what they produced).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(super) struct Error(String);

/// The dictionary of the kind `key` (apiVersion and kind), `text` becoming it if the kind
/// has none yet or `text` is more than a quarter longer (up to [`MAX_DICTIONARY`]).
fn dictionary(key: (&str, &str), text: &[u8]) -> Arc<[u8]> {
    /// By apiVersion and kind: a process caches a handful of kinds.
    type Dictionaries = Vec<((String, String), Arc<[u8]>)>;
    static DICTIONARIES: OnceLock<Mutex<Dictionaries>> = OnceLock::new();
    let fresh = || Arc::<[u8]>::from(&text[..text.len().min(MAX_DICTIONARY)]);
    let Ok(mut all) = DICTIONARIES.get_or_init(Mutex::default).lock() else {
        return fresh();
    };
    match all
        .iter_mut()
        .find(|((a, k), _)| (a.as_str(), k.as_str()) == key)
    {
        Some((_, d)) if d.len() >= MAX_DICTIONARY || text.len() <= d.len() + d.len() / 4 => {
            d.clone()
        }
        Some((_, d)) => {
            *d = fresh();
            d.clone()
        }
        None => {
            let d = fresh();
            all.push(((key.0.to_string(), key.1.to_string()), d.clone()));
            d
        }
    }
}

thread_local! {
    static DEFLATE: RefCell<Compress> = RefCell::new(Compress::new(Compression::fast(), false));
    static INFLATE: RefCell<Decompress> = RefCell::new(Decompress::new(false));
}

impl Squeezed {
    /// Deflate `text`, an object of the kind `key` (apiVersion and kind).
    pub(super) fn new(key: (&str, &str), text: &str) -> Result<Self, Error> {
        let dictionary = dictionary(key, text.as_bytes());
        let len = u32::try_from(text.len()).map_err(|e| Error(e.to_string()))?;
        let deflated = DEFLATE.with_borrow_mut(|d| deflate(d, &dictionary, text.as_bytes()))?;
        Ok(Self {
            dictionary,
            deflated: deflated.into_boxed_slice(),
            len,
        })
    }

    /// The text again.
    pub(super) fn text(&self) -> Result<String, Error> {
        let bytes = INFLATE.with_borrow_mut(|i| self.inflate(i))?;
        String::from_utf8(bytes).map_err(|e| Error(e.to_string()))
    }

    fn inflate(&self, state: &mut Decompress) -> Result<Vec<u8>, Error> {
        state.reset(false);
        state
            .set_dictionary(&self.dictionary)
            .map_err(|e| Error(e.to_string()))?;
        let mut out = Vec::with_capacity(self.len as usize);
        let status = state
            .decompress_vec(&self.deflated, &mut out, FlushDecompress::Finish)
            .map_err(|e| Error(e.to_string()))?;
        if status != Status::StreamEnd || out.len() != self.len as usize {
            return Err(Error(format!(
                "inflated {} of {} bytes",
                out.len(),
                self.len
            )));
        }
        Ok(out)
    }

    /// Bytes held for this text alone (the dictionary is shared by its kind).
    #[cfg(test)]
    pub(super) fn held(&self) -> usize {
        self.deflated.len()
    }
}

fn deflate(state: &mut Compress, dictionary: &[u8], text: &[u8]) -> Result<Vec<u8>, Error> {
    state.reset();
    state
        .set_dictionary(dictionary)
        .map_err(|e| Error(e.to_string()))?;
    // Deflate never grows a text by more than 5 bytes per 16 kB block plus a few.
    let mut out = Vec::with_capacity(text.len() + text.len() / 1024 * 5 + 64);
    loop {
        let consumed = usize::try_from(state.total_in()).map_err(|e| Error(e.to_string()))?;
        let status = state
            .compress_vec(&text[consumed..], &mut out, FlushCompress::Finish)
            .map_err(|e| Error(e.to_string()))?;
        if status == Status::StreamEnd {
            return Ok(out);
        }
        out.reserve(out.capacity().max(64));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn condition(object: &str, kind: &str) -> String {
        format!(
            r#"{{"type":"{kind}","status":"True","reason":"{kind}","message":"{object} is {kind}","lastTransitionTime":"2026-11-26T11:00:00Z","observedGeneration":1}}"#
        )
    }

    fn object(name: &str) -> String {
        let conditions: Vec<String> = ["Validated", "ProviderSelected", "ResourceCreated", "Ready"]
            .iter()
            .map(|k| condition(name, k))
            .collect();
        format!(
            r#"{{"apiVersion":"squeeze.test/v1","kind":"Thing","spec":{{"model":{{"id":"Qwen/Qwen3-0.6B"}}}},"status":{{"phase":"Running","conditions":[{}]}}}}"#,
            conditions.join(",")
        )
    }

    #[test]
    fn texts_come_back_exactly_and_the_second_of_a_kind_is_a_fraction_of_its_size() {
        let key = ("squeeze.test/v1", "Thing");
        let first = object("first");
        let second = object("the-second-one");
        let a = Squeezed::new(key, &first).unwrap();
        let b = Squeezed::new(key, &second).unwrap();
        assert_eq!(a.text().unwrap(), first);
        assert_eq!(b.text().unwrap(), second);
        assert!(Arc::ptr_eq(&a.dictionary, &b.dictionary));
        assert!(
            b.held() * 5 < second.len(),
            "{} of {} bytes",
            b.held(),
            second.len()
        );
    }

    #[test]
    fn kinds_have_their_own_dictionaries_and_any_text_round_trips() {
        let other = Squeezed::new(("squeeze.test/v1", "Other"), "{}").unwrap();
        let unlike = "x".repeat(100_000) + "ü";
        let big = Squeezed::new(("squeeze.test/v1", "Other"), &unlike).unwrap();
        assert_eq!(other.text().unwrap(), "{}");
        assert_eq!(big.text().unwrap(), unlike);
        assert_eq!(&*other.dictionary, b"{}");
    }

    #[test]
    fn a_much_longer_text_becomes_the_dictionary_and_earlier_texts_keep_theirs() {
        let key = ("squeeze.test/v1", "Growing");
        let short = Squeezed::new(key, r#"{"kind":"Growing","spec":{"a":1}}"#).unwrap();
        let same = Squeezed::new(key, r#"{"kind":"Growing","spec":{"a":22}}"#).unwrap();
        assert!(Arc::ptr_eq(&short.dictionary, &same.dictionary));
        let long = object("long");
        let longer = Squeezed::new(key, &long).unwrap();
        assert_eq!(&*longer.dictionary, long.as_bytes());
        let next = Squeezed::new(key, &object("next")).unwrap();
        assert!(Arc::ptr_eq(&longer.dictionary, &next.dictionary));
        assert_eq!(
            short.text().unwrap(),
            r#"{"kind":"Growing","spec":{"a":1}}"#
        );
        assert!(next.held() * 5 < object("next").len());
    }

    #[test]
    fn a_truncated_text_is_an_error_not_a_panic() {
        let mut s = Squeezed::new(("squeeze.test/v1", "Thing"), &object("cut")).unwrap();
        s.deflated = s.deflated[..s.deflated.len() / 2].into();
        assert!(s.text().is_err());
    }
}
