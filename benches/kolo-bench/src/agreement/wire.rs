//! An [`Offer`] as bytes, and back: a magic line, then little-endian
//! `u64` lengths and counts. Decoding checks every length against what is
//! left before it takes anything, so a peer's garbage is an error naming
//! that rank, never a panic or a huge allocation.

use super::Offer;
use crate::error::BenchError;

/// What every offer starts with (another program's message does not).
const MAGIC: &[u8] = b"kolo-bench plan v1\n";

fn put_u64(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(&n.to_le_bytes());
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_u64(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

fn put_opt_u64(out: &mut Vec<u8>, n: Option<u64>) {
    out.push(u8::from(n.is_some()));
    put_u64(out, n.unwrap_or(0));
}

/// The bytes of `offer`.
pub fn encode(offer: &Offer) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    put_u64(&mut out, offer.fields.len() as u64);
    for (name, value) in &offer.fields {
        put_str(&mut out, name);
        put_str(&mut out, value);
    }
    put_opt_u64(&mut out, offer.need);
    put_opt_u64(&mut out, offer.available);
    put_str(&mut out, &offer.source);
    put_u64(&mut out, offer.local_ranks);
    out.push(u8::from(offer.problem.is_some()));
    put_str(&mut out, offer.problem.as_deref().unwrap_or(""));
    out
}

/// Reads an offer left to right.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        if n > self.bytes.len() {
            return Err(format!(
                "{what}: {n} bytes announced, {} left",
                self.bytes.len()
            ));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn u64(&mut self, what: &str) -> Result<u64, String> {
        let mut word = [0u8; 8];
        word.copy_from_slice(self.take(8, what)?);
        Ok(u64::from_le_bytes(word))
    }

    fn flag(&mut self, what: &str) -> Result<bool, String> {
        match self.take(1, what)? {
            [0] => Ok(false),
            [1] => Ok(true),
            other => Err(format!("{what}: flag {other:?} is neither 0 nor 1")),
        }
    }

    fn string(&mut self, what: &str) -> Result<String, String> {
        let len = usize::try_from(self.u64(what)?).map_err(|_| format!("{what}: too long"))?;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| format!("{what}: not UTF-8"))
    }

    fn opt_u64(&mut self, what: &str) -> Result<Option<u64>, String> {
        let some = self.flag(what)?;
        let n = self.u64(what)?;
        Ok(some.then_some(n))
    }
}

/// The offer rank `rank` sent as `bytes`; an error naming the rank when
/// they are not one.
pub fn decode(bytes: &[u8], rank: usize) -> Result<Offer, BenchError> {
    let malformed = |reason: String| BenchError::MalformedPlan { rank, reason };
    if bytes.is_empty() {
        return Err(malformed(
            "an empty message (is that rank another program, or a kolo engine?)".into(),
        ));
    }
    let Some(body) = bytes.strip_prefix(MAGIC) else {
        return Err(malformed(format!(
            "{} bytes that are not a kolo-bench plan (another program or version?)",
            bytes.len()
        )));
    };
    let mut r = Reader { bytes: body };
    let parse = |r: &mut Reader<'_>| -> Result<Offer, String> {
        let count = r.u64("the field count")?;
        let mut fields = Vec::new();
        for i in 0..count {
            let name = r.string(&format!("field {i}'s name"))?;
            let value = r.string(&format!("field {name}'s value"))?;
            fields.push((name, value));
        }
        let need = r.opt_u64("the memory needed")?;
        let available = r.opt_u64("the memory available")?;
        let source = r.string("the memory's source")?;
        let local_ranks = r.u64("the local ranks")?;
        let has_problem = r.flag("the problem")?;
        let problem = r.string("the problem")?;
        Ok(Offer {
            fields,
            need,
            available,
            source,
            local_ranks,
            problem: has_problem.then_some(problem),
        })
    };
    let offer = parse(&mut r).map_err(malformed)?;
    if !r.bytes.is_empty() {
        return Err(malformed(format!(
            "{} bytes after the end of the plan",
            r.bytes.len()
        )));
    }
    Ok(offer)
}
