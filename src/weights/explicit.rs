//! Weights the operator gives (docs/design.md §11): `--partition-weights
//! 'topic:0=10,1=3;other:5=2'` and `--partition-weights-file PATH` (JSON
//! `{"topic": {"0": 10, "1": 3}}`), as a [`WeightSource`].
//!
//! The file is read at start (a bad file stops the start, like a bad flag) and then again
//! whenever its modification time or size changes, looked at every `--weights-refresh`
//! ([`ExplicitWeights::watch`]). A file that cannot be read or parsed on a reload is
//! logged and the last good weights are kept. Where both give a topic, the file wins; a
//! topic given with no partitions (`topic:` or `{"topic": {}}`) weighs 1 everywhere.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, Weak},
    time::{Duration, SystemTime},
};

use super::WeightSource;

/// Weights by topic, then partition.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TopicWeights(pub BTreeMap<String, BTreeMap<u32, u64>>);

/// Errors of explicit weights.
#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    /// `--partition-weights` is malformed.
    #[error("--partition-weights: {0}")]
    Flag(String),
    /// `--partition-weights-file` cannot be read or parsed.
    #[error("--partition-weights-file {path}: {reason}")]
    File {
        /// The file.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// Parses `topic:0=10,1=3;other:5=2` (empty: no weights). Weights are whole numbers
/// (0 allowed); a topic or a partition listed twice is refused.
pub fn parse_weights_flag(text: &str) -> Result<TopicWeights, String> {
    let mut topics = BTreeMap::new();
    for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let (topic, list) = part
            .split_once(':')
            .ok_or_else(|| format!("'{part}' is not topic:partition=weight,... (e.g. events:0=10,1=3)"))?;
        let topic = topic.trim();
        if topic.is_empty() {
            return Err(format!("'{part}' has no topic name"));
        }
        let mut weights = BTreeMap::new();
        for item in list.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (p, w) = item
                .split_once('=')
                .ok_or_else(|| format!("'{item}' (topic {topic}) is not partition=weight (e.g. 0=10)"))?;
            let p = partition(p.trim()).map_err(|e| format!("topic {topic}: {e}"))?;
            let w = w.trim().parse::<u64>().map_err(|_| {
                format!("topic {topic}, partition {p}: weight '{}' is not a whole number ≥ 0", w.trim())
            })?;
            if weights.insert(p, w).is_some() {
                return Err(format!("topic {topic}: partition {p} is listed twice"));
            }
        }
        if topics.insert(topic.to_string(), weights).is_some() {
            return Err(format!("topic '{topic}' is listed twice"));
        }
    }
    Ok(TopicWeights(topics))
}

fn partition(text: &str) -> Result<u32, String> {
    text.parse::<u32>().map_err(|_| format!("partition '{text}' is not a partition number"))
}

/// Parses the file's JSON: `{"topic": {"0": 10, "1": 3}}`.
pub fn parse_weights_json(bytes: &[u8]) -> Result<TopicWeights, String> {
    let raw: BTreeMap<String, BTreeMap<String, serde_json::Value>> = serde_json::from_slice(bytes)
        .map_err(|e| format!("not {{\"topic\": {{\"partition\": weight}}}} JSON: {e}"))?;
    let mut topics = BTreeMap::new();
    for (topic, list) in raw {
        if topic.trim().is_empty() {
            return Err("a topic name is empty".into());
        }
        let mut weights = BTreeMap::new();
        for (p, w) in list {
            let p = partition(p.trim()).map_err(|e| format!("topic {topic}: {e}"))?;
            let w = w.as_u64().ok_or_else(|| {
                format!("topic {topic}, partition {p}: weight {w} is not a whole number ≥ 0")
            })?;
            if weights.insert(p, w).is_some() {
                return Err(format!("topic {topic}: partition {p} is listed twice"));
            }
        }
        topics.insert(topic, weights);
    }
    Ok(TopicWeights(topics))
}

/// What identifies a version of the file: its modification time and size.
type Stamp = (Option<SystemTime>, u64);

/// The file's weights as last read well.
#[derive(Debug, Default)]
struct FileWeights {
    weights: TopicWeights,
    stamp: Option<Stamp>,
    /// Why the last look could not use the file (warned once per reason).
    error: Option<String>,
}

/// Explicit weights (see the module docs).
#[derive(Debug)]
pub struct ExplicitWeights {
    flag: TopicWeights,
    file: Option<PathBuf>,
    from_file: Mutex<FileWeights>,
}

/// What a reload did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reload {
    /// No file, or it has not changed.
    Unchanged,
    /// The file changed and its weights replace the previous ones.
    Loaded,
    /// The file changed but cannot be used; the last good weights are kept.
    Kept(String),
}

impl ExplicitWeights {
    /// The weights of `--partition-weights` and, if given, `--partition-weights-file`, read
    /// now: a file that cannot be read or parsed is an error.
    pub fn new(flag: TopicWeights, file: Option<PathBuf>) -> Result<Self, WeightsError> {
        let mut from_file = FileWeights::default();
        if let Some(path) = &file {
            let error = |reason: String| WeightsError::File { path: path.display().to_string(), reason };
            let stamp = stamp(&std::fs::metadata(path).map_err(|e| error(e.to_string()))?);
            let bytes = std::fs::read(path).map_err(|e| error(e.to_string()))?;
            let weights = parse_weights_json(&bytes).map_err(error)?;
            from_file = FileWeights { weights, stamp: Some(stamp), error: None };
        }
        Ok(Self { flag, file, from_file: Mutex::new(from_file) })
    }

    /// Reads the file again if it changed (see [`Reload`]); logs what happened.
    pub async fn reload(&self) -> Reload {
        let Some(path) = &self.file else { return Reload::Unchanged };
        let outcome = match tokio::fs::metadata(path).await {
            Err(e) => Err((None, e.to_string())),
            Ok(meta) => {
                let now = stamp(&meta);
                if self.lock().stamp == Some(now) {
                    return Reload::Unchanged;
                }
                match tokio::fs::read(path).await {
                    Err(e) => Err((Some(now), e.to_string())),
                    Ok(bytes) => parse_weights_json(&bytes).map(|w| (now, w)).map_err(|e| (Some(now), e)),
                }
            }
        };
        let mut held = self.lock();
        match outcome {
            Ok((now, weights)) => {
                tracing::info!(path = %path.display(), topics = weights.0.len(), "partition weights file reloaded");
                *held = FileWeights { weights, stamp: Some(now), error: None };
                Reload::Loaded
            }
            Err((now, reason)) => {
                // Warned once per reason, not at every look; a bad version is not read again.
                if held.error.as_deref() != Some(reason.as_str()) {
                    tracing::warn!(path = %path.display(), %reason, "partition weights file unusable; keeping the last good weights");
                    held.error = Some(reason.clone());
                }
                if now.is_some() {
                    held.stamp = now;
                }
                Reload::Kept(reason)
            }
        }
    }

    /// Looks at the file every `every` for as long as `weights` is alive (no file: does
    /// nothing).
    pub fn watch(weights: &Arc<Self>, every: Duration) -> Option<tokio::task::JoinHandle<()>> {
        weights.file.as_ref()?;
        let weak: Weak<Self> = Arc::downgrade(weights);
        Some(tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(weights) = weak.upgrade() else { return };
                weights.reload().await;
            }
        }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FileWeights> {
        self.from_file.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The file, if any.
    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }
}

fn stamp(meta: &std::fs::Metadata) -> Stamp {
    (meta.modified().ok(), meta.len())
}

impl WeightSource for ExplicitWeights {
    fn weights(&self, topic: &str) -> Option<BTreeMap<u32, u64>> {
        if let Some(weights) = self.lock().weights.0.get(topic) {
            return Some(weights.clone());
        }
        self.flag.0.get(topic).cloned()
    }

    fn describe(&self) -> String {
        match &self.file {
            Some(path) => format!("explicit weights (--partition-weights, {})", path.display()),
            None => "explicit weights (--partition-weights)".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(u32, u64)]) -> BTreeMap<u32, u64> {
        pairs.iter().copied().collect()
    }

    #[test]
    fn the_flag_parses_and_names_what_is_wrong() {
        let parsed = parse_weights_flag(" events:0=10, 1=3 ; other:5=2;empty:").expect("parses");
        assert_eq!(parsed.0["events"], map(&[(0, 10), (1, 3)]));
        assert_eq!(parsed.0["other"], map(&[(5, 2)]));
        assert_eq!(parsed.0["empty"], map(&[]));
        assert_eq!(parse_weights_flag("").expect("empty"), TopicWeights::default());
        for (bad, says) in [
            ("events", "is not topic:partition=weight"),
            (":0=1", "no topic name"),
            ("events:0", "is not partition=weight"),
            ("events:x=1", "partition 'x'"),
            ("events:0=-1", "not a whole number"),
            ("events:0=1.5", "not a whole number"),
            ("events:0=1,0=2", "listed twice"),
            ("events:0=1;events:1=1", "listed twice"),
        ] {
            let error = parse_weights_flag(bad).expect_err(bad);
            assert!(error.contains(says), "{bad}: {error}");
        }
    }

    #[test]
    fn the_file_parses_and_names_what_is_wrong() {
        let parsed = parse_weights_json(br#"{"events": {"0": 10, "1": 3}, "other": {}}"#).expect("parses");
        assert_eq!(parsed.0["events"], map(&[(0, 10), (1, 3)]));
        assert_eq!(parsed.0["other"], map(&[]));
        for (bad, says) in [
            (&br#"{"events": {"x": 1}}"#[..], "partition 'x'"),
            (br#"{"events": {"0": -2}}"#, "not a whole number"),
            (br#"{"events": {"0": "ten"}}"#, "not a whole number"),
            (br#"[1, 2]"#, "JSON"),
        ] {
            let error = parse_weights_json(bad).expect_err("bad");
            assert!(error.contains(says), "{error}");
        }
    }

    #[tokio::test]
    async fn the_file_wins_is_reloaded_when_it_changes_and_a_bad_one_keeps_the_last_good() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("weights.json");
        std::fs::write(&path, r#"{"events": {"0": 10}}"#).expect("write");
        let flag = parse_weights_flag("events:0=1;orders:2=5").expect("flag");
        let weights = ExplicitWeights::new(flag, Some(path.clone())).expect("reads the file");
        assert_eq!(weights.weights("events"), Some(map(&[(0, 10)])), "the file wins");
        assert_eq!(weights.weights("orders"), Some(map(&[(2, 5)])), "the flag where the file is silent");
        assert_eq!(weights.weights("unknown"), None);
        assert_eq!(weights.reload().await, Reload::Unchanged);

        std::fs::write(&path, r#"{"events": {"0": 20, "1": 4}}"#).expect("write");
        assert_eq!(weights.reload().await, Reload::Loaded);
        assert_eq!(weights.weights("events"), Some(map(&[(0, 20), (1, 4)])));

        std::fs::write(&path, r#"{"events": {"0": "#).expect("write");
        assert!(matches!(weights.reload().await, Reload::Kept(_)));
        assert_eq!(weights.weights("events"), Some(map(&[(0, 20), (1, 4)])), "the last good weights");
        std::fs::remove_file(&path).expect("remove");
        assert!(matches!(weights.reload().await, Reload::Kept(_)));
        assert_eq!(weights.weights("events"), Some(map(&[(0, 20), (1, 4)])));

        let missing = ExplicitWeights::new(TopicWeights::default(), Some(path.clone())).expect_err("no file");
        assert!(missing.to_string().starts_with("--partition-weights-file"), "{missing}");
        std::fs::write(&path, "{").expect("write");
        let bad = ExplicitWeights::new(TopicWeights::default(), Some(path)).expect_err("bad file");
        assert!(bad.to_string().contains("JSON"), "{bad}");
    }
}
