//! The shop's image: what a load builds that does not depend on the seed or the variant — the
//! products' fixed fields, the search index, the noun table — as typed arrays and byte heaps in
//! one buffer. A load maps it from the index cache (a file the first load wrote, checked before
//! use: [`open`]) or builds it and keeps it in memory ([`Parts::in_memory`]).
//!
//! File layout (little-endian): a 4 KiB header, then the sections, each 64-byte aligned.
//!
//! | bytes | what |
//! |---|---|
//! | 0..8 | magic `PCSDWSI\0` |
//! | 8..12 | format ([`FORMAT`]) |
//! | 16..24 | total length of the file |
//! | 24..32 | xxh3-64 of the body (every byte after the header) |
//! | 32..40 | xxh3-64 of the header with these 8 bytes zero |
//! | 64..128 | the engine version that wrote it ([`ENGINE`], zero-padded) |
//! | 128..132 | length of the cache key |
//! | 256..640 | the section table: [`MAX_SECTIONS`] x (offset u64, length u64) |
//! | 1024..4096 | the cache key (JSON: the catalogue files' sizes, mtimes and digests, the goal set) |
//!
//! Nothing in a file is trusted before its magic, format, engine version, key, length and both
//! checksums are checked; a file that fails is reported ([`Invalid`]) and rebuilt by the caller.
//! A written file is never changed in place (a new one is written beside it and renamed over it),
//! so a mapped file stays what was checked.

use std::fmt;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::Path;

use bytemuck::Pod;
use memmap2::{Mmap, MmapMut};
use xxhash_rust::xxh3::{xxh3_64, Xxh3};

pub const MAGIC: [u8; 8] = *b"PCSDWSI\0";
/// The header and section layout.
pub const FORMAT: u32 = 1;
/// What the sections hold and how they were made: bump the last number when the analyzer, a
/// record layout, the goal weights or anything else the image holds changes.
pub const ENGINE: &str = concat!("pcsd-envpool ", env!("CARGO_PKG_VERSION"), "; webshop image 4");
pub const HEADER_LEN: usize = 4096;
pub const MAX_SECTIONS: usize = 24;
const ALIGN: usize = 64;

const H_FORMAT: usize = 8;
const H_TOTAL: usize = 16;
const H_BODY_SUM: usize = 24;
const H_HEAD_SUM: usize = 32;
const H_ENGINE: usize = 64;
const ENGINE_LEN: usize = 64;
const H_KEY_LEN: usize = 128;
const H_SECTIONS: usize = 256;
const H_KEY: usize = 1024;
/// The longest cache key the header holds.
pub const MAX_KEY_LEN: usize = HEADER_LEN - H_KEY;

/// The sections of an image (their index in the section table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sec {
    /// `catalog::ProdRec` per product.
    ProdRecs = 0,
    /// The products' strings and lists.
    ProdBlob,
    /// Product indices (u64) in ASIN order.
    ByAsin,
    /// Product indices (u32) in title order.
    ByTitle,
    /// `reward::NounSpan` per product.
    NounSpans,
    /// The nouns, joined by `\n` per name.
    NounBlob,
    /// `search::IndexStats`.
    IdxStats,
    /// `search::TermRec` per term.
    TermRecs,
    /// The term dictionary: open addressing, term id + 1 per slot (u32).
    TermHash,
    /// Offsets (u64) of each term's text in `TermStr`, one more than the terms.
    TermStrOff,
    TermStr,
    /// Postings: varint gaps and term frequencies, term after term.
    Postings,
    /// `search::Block` per block of `search::BLOCK` postings (terms with more postings).
    Blocks,
    /// Per doc: 1 / (k1 ((1 - b) + b L / avgdl)), f32.
    NormInv,
    /// Per doc: the rank of its ASIN (u32), the tie order.
    AsinRank,
    /// Per doc: its length as Lucene's one-byte norm (u8).
    NormByte,
}

/// The pieces of each section, to be laid out in one image.
#[derive(Default)]
pub struct Parts<'a> {
    secs: Vec<(Sec, Vec<&'a [u8]>)>,
}

fn align_up(x: usize) -> usize {
    x.div_ceil(ALIGN) * ALIGN
}

/// Why a cache file was not used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Invalid {
    /// No such file.
    Missing,
    /// Not a pcsd WebShop index cache (wrong magic).
    Foreign,
    /// Written by another engine version or format.
    Version(String),
    /// Made from other catalogue files (or other files of the same name).
    Stale(String),
    /// Truncated, or a checksum does not match.
    Damaged(String),
    /// The file could not be read.
    Unreadable(String),
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Invalid::Missing => f.write_str("missing"),
            Invalid::Foreign => f.write_str("not a pcsd WebShop index cache (foreign file)"),
            Invalid::Version(m) => write!(f, "from another engine version ({m})"),
            Invalid::Stale(m) => write!(f, "stale ({m})"),
            Invalid::Damaged(m) => write!(f, "damaged ({m})"),
            Invalid::Unreadable(m) => write!(f, "unreadable ({m})"),
        }
    }
}

impl<'a> Parts<'a> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends `bytes` to section `s`.
    pub fn add(&mut self, s: Sec, bytes: &'a [u8]) {
        match self.secs.iter_mut().find(|(k, _)| *k == s) {
            Some((_, v)) => v.push(bytes),
            None => self.secs.push((s, vec![bytes])),
        }
    }

    /// Appends a typed array to section `s`.
    pub fn add_pod<T: Pod>(&mut self, s: Sec, v: &'a [T]) {
        self.add(s, bytemuck::cast_slice(v));
    }

    /// Section offsets and lengths, and the image's total length.
    fn layout(&self) -> ([(u64, u64); MAX_SECTIONS], usize) {
        let mut table = [(0u64, 0u64); MAX_SECTIONS];
        let mut at = HEADER_LEN;
        for (i, entry) in table.iter_mut().enumerate() {
            let Some((_, pieces)) = self.secs.iter().find(|(k, _)| *k as usize == i) else {
                *entry = (at as u64, 0);
                continue;
            };
            let len: usize = pieces.iter().map(|p| p.len()).sum();
            *entry = (at as u64, len as u64);
            at = align_up(at + len);
        }
        (table, at)
    }

    /// Writes the image: the body first (hashed as it goes), the header last.
    fn write_to<W: Write + Seek>(&self, w: &mut W, key: &str) -> io::Result<usize> {
        if key.len() > MAX_KEY_LEN {
            return Err(io::Error::other(format!(
                "the cache key is {} bytes (at most {MAX_KEY_LEN})",
                key.len()
            )));
        }
        let (table, total) = self.layout();
        let mut hasher = Xxh3::new();
        let zeros = [0u8; ALIGN];
        w.seek(SeekFrom::Start(HEADER_LEN as u64))?;
        let mut at = HEADER_LEN;
        for (i, &(off, _)) in table.iter().enumerate() {
            let off = off as usize;
            if off > at {
                let pad = &zeros[..off - at];
                w.write_all(pad)?;
                hasher.update(pad);
                at = off;
            }
            if let Some((_, pieces)) = self.secs.iter().find(|(k, _)| *k as usize == i) {
                for p in pieces {
                    w.write_all(p)?;
                    hasher.update(p);
                    at += p.len();
                }
            }
        }
        if total > at {
            let pad = &zeros[..total - at];
            w.write_all(pad)?;
            hasher.update(pad);
        }
        let mut head = vec![0u8; HEADER_LEN];
        head[..8].copy_from_slice(&MAGIC);
        head[H_FORMAT..H_FORMAT + 4].copy_from_slice(&FORMAT.to_le_bytes());
        head[H_TOTAL..H_TOTAL + 8].copy_from_slice(&(total as u64).to_le_bytes());
        head[H_BODY_SUM..H_BODY_SUM + 8].copy_from_slice(&hasher.digest().to_le_bytes());
        head[H_ENGINE..H_ENGINE + ENGINE.len()].copy_from_slice(ENGINE.as_bytes());
        head[H_KEY_LEN..H_KEY_LEN + 4].copy_from_slice(&(key.len() as u32).to_le_bytes());
        for (i, (off, len)) in table.iter().enumerate() {
            let at = H_SECTIONS + 16 * i;
            head[at..at + 8].copy_from_slice(&off.to_le_bytes());
            head[at + 8..at + 16].copy_from_slice(&len.to_le_bytes());
        }
        head[H_KEY..H_KEY + key.len()].copy_from_slice(key.as_bytes());
        let sum = xxh3_64(&head);
        head[H_HEAD_SUM..H_HEAD_SUM + 8].copy_from_slice(&sum.to_le_bytes());
        w.seek(SeekFrom::Start(0))?;
        w.write_all(&head)?;
        w.flush()?;
        Ok(total)
    }

    /// The image in anonymous memory (no file).
    pub fn in_memory(&self, key: &str) -> io::Result<Image> {
        let (_, total) = self.layout();
        let mut map = MmapMut::map_anon(total)?;
        self.write_to(&mut io::Cursor::new(&mut map[..]), key)?;
        let map = map.make_read_only()?;
        Image::from_map(map).map_err(|e| io::Error::other(e.to_string()))
    }

    /// Writes the image to `path`: into a new file beside it, renamed over `path` once whole (a
    /// reader sees the old file or the new one, never a part). The new file is mapped and
    /// returned.
    pub fn write_file(&self, path: &Path, key: &str) -> io::Result<Image> {
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir)?;
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("webshop-index");
        let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
        let res = (|| {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&tmp)?;
            let mut w = io::BufWriter::with_capacity(8 << 20, file);
            self.write_to(&mut w, key)?;
            let file = w.into_inner().map_err(|e| e.into_error())?;
            std::fs::rename(&tmp, path)?;
            // SAFETY: the file was just written by this process and is only ever replaced by a
            // rename, never changed in place (see the module docs).
            let map = unsafe { Mmap::map(&file)? };
            Image::from_map(map).map_err(|e| io::Error::other(e.to_string()))
        })();
        if res.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        res
    }
}

/// One image, mapped from a file or held in anonymous memory; read-only.
pub struct Image {
    map: Mmap,
    sections: [(usize, usize); MAX_SECTIONS],
    key: String,
}

impl fmt::Debug for Image {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Image({} bytes)", self.map.len())
    }
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// The parts of a header that say what the file is: checked before the body is read.
fn check_header(head: &[u8], file_len: u64) -> Result<(String, [(usize, usize); MAX_SECTIONS]), Invalid> {
    if head.len() < HEADER_LEN {
        return Err(if head.len() >= 8 && head[..8] != MAGIC {
            Invalid::Foreign
        } else {
            Invalid::Damaged(format!("truncated: {file_len} bytes"))
        });
    }
    if head[..8] != MAGIC {
        return Err(Invalid::Foreign);
    }
    let mut zeroed = head[..HEADER_LEN].to_vec();
    zeroed[H_HEAD_SUM..H_HEAD_SUM + 8].fill(0);
    if xxh3_64(&zeroed) != le_u64(head, H_HEAD_SUM) {
        return Err(Invalid::Damaged("header checksum mismatch".into()));
    }
    let format = le_u32(head, H_FORMAT);
    let engine_bytes = &head[H_ENGINE..H_ENGINE + ENGINE_LEN];
    let engine = String::from_utf8_lossy(engine_bytes.split(|&b| b == 0).next().unwrap_or(&[])).into_owned();
    if format != FORMAT || engine != ENGINE {
        return Err(Invalid::Version(format!(
            "written by {engine:?} format {format}, this is {ENGINE:?} format {FORMAT}"
        )));
    }
    let total = le_u64(head, H_TOTAL);
    if total != file_len {
        return Err(Invalid::Damaged(format!(
            "{file_len} bytes, the header says {total}{}",
            if file_len < total { ": truncated" } else { "" }
        )));
    }
    let key_len = le_u32(head, H_KEY_LEN) as usize;
    if key_len > MAX_KEY_LEN {
        return Err(Invalid::Damaged("bad key length".into()));
    }
    let key = std::str::from_utf8(&head[H_KEY..H_KEY + key_len])
        .map_err(|_| Invalid::Damaged("the key is not text".into()))?
        .to_string();
    let mut sections = [(0usize, 0usize); MAX_SECTIONS];
    for (i, s) in sections.iter_mut().enumerate() {
        let off = le_u64(head, H_SECTIONS + 16 * i);
        let len = le_u64(head, H_SECTIONS + 16 * i + 8);
        let end = off.checked_add(len);
        if off < HEADER_LEN as u64 || !off.is_multiple_of(ALIGN as u64) || end.is_none_or(|e| e > total) {
            return Err(Invalid::Damaged(format!("section {i} out of bounds")));
        }
        *s = (off as usize, len as usize);
    }
    Ok((key, sections))
}

impl Image {
    fn from_map(map: Mmap) -> Result<Image, Invalid> {
        let (key, sections) = check_header(&map, map.len() as u64)?;
        Ok(Image { map, sections, key })
    }

    /// The bytes of section `s`.
    pub fn bytes(&self, s: Sec) -> &[u8] {
        let (off, len) = self.sections[s as usize];
        &self.map[off..off + len]
    }

    /// Section `s` as an array of `T` (checked when the image was opened).
    pub fn pod<T: Pod>(&self, s: Sec) -> &[T] {
        bytemuck::cast_slice(self.bytes(s))
    }

    /// Section `s` as an array of `T`, or why it is not one.
    pub fn try_pod<T: Pod>(&self, s: Sec) -> Result<&[T], String> {
        bytemuck::try_cast_slice(self.bytes(s))
            .map_err(|e| format!("section {s:?} is not an array of {}: {e}", std::any::type_name::<T>()))
    }

    /// The cache key the image was made with.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Bytes in the image.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// Opens the cache file `path` made with `key`: checks the header, the key, the length and the
/// body's checksum (read through the file, not the map, so that checking does not make the whole
/// file resident), then maps it.
pub fn open(path: &Path, key: &str) -> Result<Image, Invalid> {
    // not a regular file (a named pipe would block the open until a writer comes, a device or a
    // folder is no cache): passed over before it is opened
    match std::fs::metadata(path) {
        Ok(m) if !m.is_file() => return Err(Invalid::Unreadable(format!("not a regular file but {}", file_kind(&m)))),
        _ => {}
    }
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) if matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::NotADirectory) => {
            return Err(Invalid::Missing)
        }
        Err(e) => return Err(Invalid::Unreadable(e.to_string())),
    };
    let unreadable = |e: io::Error| Invalid::Unreadable(e.to_string());
    let file_len = file.metadata().map_err(unreadable)?.len();
    let mut head = Vec::with_capacity(HEADER_LEN);
    (&mut file)
        .take(HEADER_LEN as u64)
        .read_to_end(&mut head)
        .map_err(unreadable)?;
    let (found_key, _) = check_header(&head, file_len)?;
    if found_key != key {
        return Err(Invalid::Stale(describe_key_change(&found_key, key)));
    }
    let mut hasher = Xxh3::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(unreadable)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    if hasher.digest() != le_u64(&head, H_BODY_SUM) {
        return Err(Invalid::Damaged("body checksum mismatch".into()));
    }
    // SAFETY: cache files are only ever replaced by a rename, never changed in place (module
    // docs); the bytes mapped are the ones just checked.
    let map = unsafe { Mmap::map(&file) }.map_err(unreadable)?;
    if map.len() as u64 != file_len {
        return Err(Invalid::Damaged("the file changed while it was checked".into()));
    }
    Image::from_map(map)
}

/// What a file that is not a regular one is, in words.
fn file_kind(m: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = m.file_type();
    if t.is_dir() {
        "a folder"
    } else if t.is_fifo() {
        "a named pipe"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_block_device() || t.is_char_device() {
        "a device"
    } else {
        "not a file"
    }
}

/// What differs between two cache keys, in words.
fn describe_key_change(old: &str, new: &str) -> String {
    let (Ok(o), Ok(n)) = (
        serde_json::from_str::<serde_json::Value>(old),
        serde_json::from_str::<serde_json::Value>(new),
    ) else {
        return "made from other files".into();
    };
    let files = |v: &serde_json::Value| v["files"].as_array().cloned().unwrap_or_default();
    for nf in files(&n) {
        let role = nf["role"].as_str().unwrap_or("?");
        let name = nf["name"].as_str().unwrap_or("?");
        match files(&o).into_iter().find(|f| f["role"] == nf["role"]) {
            None => return format!("made without {name}"),
            Some(of) if of != nf => {
                let what: Vec<&str> = ["name", "size", "mtime_ns", "head", "tail"]
                    .into_iter()
                    .filter(|k| of[*k] != nf[*k])
                    .collect();
                let _ = role;
                return format!("{name} changed: {}", what.join(", "));
            }
            Some(_) => {}
        }
    }
    for k in ["goals", "num_products"] {
        if o[k] != n[k] {
            return format!("made for {k} {}, not {}", o[k], n[k]);
        }
    }
    "made from other files".into()
}

/// Bytes hashed at each end of a catalogue file for its cache key.
const DIGEST_SPAN: u64 = 1 << 20;

/// One file's part of a cache key: name, size, mtime and xxh3 digests of its first and last MiB.
pub fn file_key(role: &str, path: &Path) -> io::Result<serde_json::Value> {
    use std::os::unix::fs::FileExt;
    let file = File::open(path)?;
    let meta = file.metadata()?;
    let size = meta.len();
    let mtime_ns = meta
        .modified()?
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let span = size.min(DIGEST_SPAN);
    let mut buf = vec![0u8; span as usize];
    file.read_exact_at(&mut buf, 0)?;
    let head = xxh3_64(&buf);
    file.read_exact_at(&mut buf, size - span)?;
    let tail = xxh3_64(&buf);
    Ok(serde_json::json!({
        "role": role,
        "name": path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        "size": size,
        "mtime_ns": mtime_ns,
        "head": format!("{head:016x}"),
        "tail": format!("{tail:016x}"),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> (Vec<u32>, Vec<u8>, Vec<f32>) {
        ((0..1000).collect(), b"hello image".to_vec(), vec![1.5, -2.0, 3.25])
    }

    fn parts<'a>(a: &'a [u32], b: &'a [u8], c: &'a [f32]) -> Parts<'a> {
        let mut p = Parts::new();
        p.add_pod(Sec::TermHash, a);
        p.add(Sec::TermStr, &b[..5]);
        p.add(Sec::TermStr, &b[5..]);
        p.add_pod(Sec::NormInv, c);
        p
    }

    #[test]
    fn written_image_reads_back_in_memory_and_from_a_file() {
        let (a, b, c) = sample();
        let p = parts(&a, &b, &c);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.pcsd-index");
        for img in [
            p.in_memory("{\"k\":1}").unwrap(),
            p.write_file(&path, "{\"k\":1}").unwrap(),
        ] {
            assert_eq!(img.pod::<u32>(Sec::TermHash), &a[..]);
            assert_eq!(img.bytes(Sec::TermStr), &b[..]);
            assert_eq!(img.pod::<f32>(Sec::NormInv), &c[..]);
            assert!(img.bytes(Sec::Postings).is_empty());
            assert_eq!(img.key(), "{\"k\":1}");
        }
        let img = open(&path, "{\"k\":1}").unwrap();
        assert_eq!(img.pod::<u32>(Sec::TermHash), &a[..]);
        assert_eq!(
            open(&path, "{\"k\":2}").unwrap_err(),
            Invalid::Stale("made from other files".into())
        );
        assert_eq!(open(&dir.path().join("none"), "k").unwrap_err(), Invalid::Missing);
        // no temporary file is left behind
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// Any changed byte, and any truncation, is caught before the image is used.
        #[test]
        fn corrupted_or_truncated_files_are_never_trusted(at in 0usize..8000, flip in 1u8..=255, cut in 0usize..8000) {
            let (a, b, c) = sample();
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("x.pcsd-index");
            parts(&a, &b, &c).write_file(&path, "key").unwrap();
            let good = std::fs::read(&path).unwrap();
            let mut bad = good.clone();
            let at = at % bad.len();
            bad[at] ^= flip;
            std::fs::write(&path, &bad).unwrap();
            let err = open(&path, "key").unwrap_err();
            proptest::prop_assert!(matches!(err, Invalid::Damaged(_) | Invalid::Foreign | Invalid::Version(_) | Invalid::Stale(_)), "{err:?}");
            let cut = cut % good.len();
            std::fs::write(&path, &good[..cut]).unwrap();
            let err = open(&path, "key").unwrap_err();
            proptest::prop_assert!(matches!(err, Invalid::Damaged(_) | Invalid::Foreign), "{err:?}");
            std::fs::write(&path, &good).unwrap();
            proptest::prop_assert!(open(&path, "key").is_ok());
        }
    }

    #[test]
    fn foreign_and_other_version_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.pcsd-index");
        std::fs::write(&path, b"{\"not\": \"an image\"}").unwrap();
        assert_eq!(open(&path, "k").unwrap_err(), Invalid::Foreign);
        let (a, b, c) = sample();
        parts(&a, &b, &c).write_file(&path, "k").unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[H_ENGINE..H_ENGINE + 4].copy_from_slice(b"xxxx");
        let mut head = bytes[..HEADER_LEN].to_vec();
        head[H_HEAD_SUM..H_HEAD_SUM + 8].fill(0);
        let sum = xxh3_64(&head);
        bytes[H_HEAD_SUM..H_HEAD_SUM + 8].copy_from_slice(&sum.to_le_bytes());
        std::fs::write(&path, &bytes).unwrap();
        assert!(matches!(open(&path, "k").unwrap_err(), Invalid::Version(_)));
    }

    #[test]
    fn key_changes_are_described() {
        let k = |size: u64| {
            serde_json::json!({"files": [{"role": "products", "name": "items.json", "size": size, "mtime_ns": 1,
                "head": "a", "tail": "b"}], "goals": "synthetic", "num_products": null})
            .to_string()
        };
        assert_eq!(describe_key_change(&k(1), &k(2)), "items.json changed: size");
        let g = k(1).replace("synthetic", "human");
        assert_eq!(
            describe_key_change(&k(1), &g),
            "made for goals \"synthetic\", not \"human\""
        );
    }
}
