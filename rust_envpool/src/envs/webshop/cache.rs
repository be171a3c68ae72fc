//! The index cache: where a shop's image ([`super::image`]) is kept between loads, what it is
//! keyed by, and what a load says when it cannot use one.
//!
//! * Where: the folder `WEBSHOP_CACHE` names ([`CachePolicy::Dir`]), else beside the catalogue
//!   ([`CachePolicy::Default`]); when the catalogue's folder is read-only (a shared data folder),
//!   the user's cache folder (`$XDG_CACHE_HOME/pcsd/webshop-index`, else
//!   `~/.cache/pcsd/webshop-index`). When no folder takes it, the image stays in memory and the
//!   next load builds it again: a load never fails for the cache's sake.
//! * Key: the engine version ([`super::image::ENGINE`]), the goal set, `num_products`, and per
//!   file read (products, attributes, human instructions for human goals, noun table) its name,
//!   size, mtime and the xxh3 digests of its first and last MiB. A file whose key differs is
//!   stale; one that fails a check is damaged or foreign; either is rebuilt with one line.
//! * Name: `<catalogue>.<goals>[.first<N>].<8 hex digits of the files' paths>.pcsd-index`, so
//!   that several catalogues and noun tables can share a folder.

use std::path::{Path, PathBuf};

use xxhash_rust::xxh3::xxh3_64;

use super::goals::GoalSet;
use super::image;
use super::{ShopFiles, WebShopError};

/// Where a load looks for and writes the index cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CachePolicy {
    /// No cache: the image is built and kept in memory.
    Off,
    /// Beside the catalogue, else (read-only folder) the user's cache folder.
    Default,
    /// This folder.
    Dir(PathBuf),
}

impl CachePolicy {
    /// The policy a `WEBSHOP_CACHE` value names: unset or empty -> [`CachePolicy::Default`];
    /// `off`, `none`, `0` or `false` -> [`CachePolicy::Off`]; anything else a folder.
    pub fn parse(value: Option<&str>) -> CachePolicy {
        match value.map(str::trim) {
            None | Some("") => CachePolicy::Default,
            Some(v) if ["off", "none", "0", "false"].contains(&v.to_ascii_lowercase().as_str()) => CachePolicy::Off,
            Some(v) => CachePolicy::Dir(PathBuf::from(v)),
        }
    }
}

/// What a load did with the cache.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CacheReport {
    /// The file the image is mapped from (None: it is held in memory).
    pub path: Option<PathBuf>,
    /// The image came from the cache (false: this load built it).
    pub hit: bool,
    /// One line per thing to tell the user: a stale, foreign or damaged cache rebuilt, a folder
    /// that could not take the cache.
    pub notes: Vec<String>,
}

/// The user's cache folder for index caches.
pub fn user_cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| PathBuf::from(h).join(".cache"))
        })?;
    Some(base.join("pcsd").join("webshop-index"))
}

/// The files a load with this goal set reads, with their role in the key.
fn files_read(files: &ShopFiles, goals: GoalSet) -> Vec<(&'static str, &Path)> {
    let mut out = vec![
        ("products", files.products.as_path()),
        ("attributes", files.attributes.as_path()),
    ];
    if goals == GoalSet::Human {
        out.push(("human", files.human_attributes.as_path()));
    }
    out.push(("nouns", files.nouns.as_path()));
    out
}

fn goals_name(goals: GoalSet) -> &'static str {
    match goals {
        GoalSet::Synthetic => "synthetic",
        GoalSet::Human => "human",
    }
}

/// The cache key of a load (JSON). Errors name a file that cannot be read.
pub fn key(files: &ShopFiles, goals: GoalSet, num_products: Option<usize>) -> Result<String, WebShopError> {
    let mut entries = Vec::new();
    for (role, path) in files_read(files, goals) {
        let e = image::file_key(role, path).map_err(|e| {
            if role == "nouns" {
                WebShopError::Load(format!(
                    "noun table {}: {e} (the reward's type score needs it)",
                    path.display()
                ))
            } else {
                WebShopError::Load(format!("{}: {e}", path.display()))
            }
        })?;
        entries.push(e);
    }
    Ok(serde_json::json!({
        "files": entries,
        "goals": goals_name(goals),
        "num_products": num_products,
    })
    .to_string())
}

/// The cache file's name for a load.
pub fn file_name(files: &ShopFiles, goals: GoalSet, num_products: Option<usize>) -> String {
    let stem = files
        .products
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "items".into());
    let mut who = String::new();
    for (_, p) in files_read(files, goals) {
        let p = p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
        who.push_str(&p.to_string_lossy());
        who.push('\0');
    }
    let first = num_products.map(|n| format!(".first{n}")).unwrap_or_default();
    format!(
        "{stem}.{}{first}.{:08x}.pcsd-index",
        goals_name(goals),
        xxh3_64(who.as_bytes()) as u32
    )
}

/// Whether the cache may be written in `dir`: a folder without write permission bits is
/// read-only here even for a user (root) whom the system would let write (a shared data
/// folder is left alone).
pub fn check_writable(dir: &Path) -> std::io::Result<()> {
    match std::fs::metadata(dir) {
        Ok(m) if m.permissions().readonly() => Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            "read-only folder",
        )),
        _ => Ok(()),
    }
}

/// The folders a load looks in, in order.
pub fn folders(policy: &CachePolicy, files: &ShopFiles) -> Vec<PathBuf> {
    match policy {
        CachePolicy::Off => Vec::new(),
        CachePolicy::Dir(d) => vec![d.clone()],
        CachePolicy::Default => {
            let beside = files
                .products
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_else(|| ".".into());
            let mut out = vec![beside];
            if let Some(user) = user_cache_dir() {
                if !out.contains(&user) {
                    out.push(user);
                }
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_from_the_environment_value() {
        assert_eq!(CachePolicy::parse(None), CachePolicy::Default);
        assert_eq!(CachePolicy::parse(Some(" ")), CachePolicy::Default);
        for off in ["off", "OFF", "none", "0", "false"] {
            assert_eq!(CachePolicy::parse(Some(off)), CachePolicy::Off, "{off}");
        }
        assert_eq!(CachePolicy::parse(Some("/tmp/c")), CachePolicy::Dir("/tmp/c".into()));
    }

    #[test]
    fn names_tell_catalogues_goal_sets_and_limits_apart() {
        let f = |dir: &str| ShopFiles {
            products: PathBuf::from(dir).join("items_shuffle.json"),
            attributes: PathBuf::from(dir).join("items_ins_v2.json"),
            human_attributes: PathBuf::from(dir).join("items_human_ins.json"),
            nouns: PathBuf::from(dir).join("spacy_nouns.json"),
        };
        let a = file_name(&f("/a"), GoalSet::Synthetic, None);
        assert!(
            a.starts_with("items_shuffle.synthetic.") && a.ends_with(".pcsd-index"),
            "{a}"
        );
        assert_ne!(a, file_name(&f("/b"), GoalSet::Synthetic, None));
        assert_ne!(a, file_name(&f("/a"), GoalSet::Human, None));
        assert!(file_name(&f("/a"), GoalSet::Synthetic, Some(100)).contains(".first100."));
    }
}
