//! The on-disk format of drafter training data (`blockdraft-taps/1`).
//!
//! A data directory holds `manifest.json` (what made it: model, taps,
//! template, prompts, limits) and shards `shard-NNNNN.safetensors`, shard `k`
//! covering prompts `k·shard_size .. (k+1)·shard_size` of the prompts file.
//! Each shard holds, for its `n` sequences of `N` tokens in all:
//!
//! | tensor         | dtype | shape        | meaning                                        |
//! |----------------|-------|--------------|------------------------------------------------|
//! | `input_ids`    | I32   | `[N]`        | prompt + greedy response, sequences back to back |
//! | `seq_offsets`  | I64   | `[n + 1]`    | sequence `i` is `offsets[i]..offsets[i+1]`     |
//! | `prompt_lens`  | I32   | `[n]`        | prompt tokens of each sequence (the rest is response) |
//! | `prompt_index` | I32   | `[n]`        | line of the prompts file (0-based)             |
//! | `finished`     | U8    | `[n]`        | 1 where the response ended with an end-of-generation token |
//! | `taps`         | F16   | `[N, T·H]`   | row `j` = the tapped hidden states at position `j` |
//!
//! Taps are the inputs of the GGUF blocks in `tap_layers` (block `n_layer` =
//! the last block's output before the final norm), concatenated in that
//! order: HF `hidden_states[l]` for GGUF tap `l`. A shard is written to a
//! temporary name and renamed, so a shard that exists is complete.

use anyhow::{bail, ensure, Context, Result};
use half::f16;
use safetensors::{Dtype, SafeTensors, View};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

pub const FORMAT: &str = "blockdraft-taps/1";

/// What a data directory was made from; a resumed run must match it exactly.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub model_name: String,
    pub architecture: String,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_vocab: usize,
    pub tap_layers: Vec<usize>,
    /// FNV-1a of the chat template source.
    pub template_hash: String,
    pub system: Option<String>,
    /// FNV-1a of the prompts file.
    pub prompts_hash: String,
    pub n_prompts: usize,
    pub shard_size: usize,
    pub max_new_tokens: usize,
    pub max_prompt_tokens: usize,
    /// The KV cache type the answers were generated with (`--kv-type`):
    /// greedy answers depend on it. Directories made before it was
    /// recorded used f32.
    #[serde(default = "kv_type_before_it_was_recorded")]
    pub kv_type: String,
}

fn kv_type_before_it_was_recorded() -> String {
    "f32".into()
}

impl Manifest {
    /// Fails naming the first field where `self` (this run) differs from
    /// `stored` (the directory's).
    pub fn check_resumable(&self, stored: &Manifest, dir: &Path) -> Result<()> {
        let ours = serde_json::to_value(self)?;
        let theirs = serde_json::to_value(stored)?;
        let (ours, theirs) = (ours.as_object().unwrap(), theirs.as_object().unwrap());
        for (key, value) in ours {
            if theirs.get(key) != Some(value) {
                bail!(
                    "{} was made with {key} = {}, this run has {key} = {value}; \
                     use another --out directory",
                    dir.display(),
                    theirs.get(key).map_or("nothing".into(), |v| v.to_string())
                );
            }
        }
        Ok(())
    }

    pub fn n_shards(&self) -> usize {
        self.n_prompts.div_ceil(self.shard_size)
    }

    pub fn tap_width(&self) -> usize {
        self.tap_layers.len() * self.n_embd
    }
}

/// 64-bit FNV-1a, as a hex string: a stable fingerprint of a file or text.
pub fn fnv1a(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

pub fn shard_path(dir: &Path, index: usize) -> PathBuf {
    dir.join(format!("shard-{index:05}.safetensors"))
}

/// One generated sequence.
pub struct Sequence {
    pub prompt_index: usize,
    pub ids: Vec<u32>,
    pub prompt_len: usize,
    pub finished: bool,
    /// `ids.len() × tap_width` values.
    pub taps: Vec<f16>,
}

/// The sequences of one shard, gathered before it is written.
#[derive(Default)]
pub struct ShardBuilder {
    ids: Vec<i32>,
    offsets: Vec<i64>,
    prompt_lens: Vec<i32>,
    prompt_index: Vec<i32>,
    finished: Vec<u8>,
    taps: Vec<f16>,
}

struct Raw<'a> {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: &'a [u8],
}

impl View for Raw<'_> {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

/// Little-endian bytes of numbers, as safetensors stores them.
fn le_bytes<const N: usize, T: Copy>(v: &[T], to_le: fn(T) -> [u8; N]) -> Vec<u8> {
    v.iter().flat_map(|&x| to_le(x)).collect()
}

impl ShardBuilder {
    pub fn push(&mut self, seq: Sequence) {
        if self.offsets.is_empty() {
            self.offsets.push(0);
        }
        self.ids.extend(seq.ids.iter().map(|&t| t as i32));
        self.offsets.push(self.ids.len() as i64);
        self.prompt_lens.push(seq.prompt_len as i32);
        self.prompt_index.push(seq.prompt_index as i32);
        self.finished.push(seq.finished as u8);
        self.taps.extend_from_slice(&seq.taps);
    }

    /// Writes the shard atomically (temporary file, then rename).
    pub fn write(mut self, path: &Path, manifest: &Manifest) -> Result<()> {
        if self.offsets.is_empty() {
            self.offsets.push(0);
        }
        let n = self.prompt_lens.len();
        let bytes = [
            le_bytes(&self.ids, i32::to_le_bytes),
            le_bytes(&self.offsets, i64::to_le_bytes),
            le_bytes(&self.prompt_lens, i32::to_le_bytes),
            le_bytes(&self.prompt_index, i32::to_le_bytes),
            self.finished.clone(),
            le_bytes(&self.taps, f16::to_le_bytes),
        ];
        let layout = [
            ("input_ids", Dtype::I32, vec![self.ids.len()]),
            ("seq_offsets", Dtype::I64, vec![n + 1]),
            ("prompt_lens", Dtype::I32, vec![n]),
            ("prompt_index", Dtype::I32, vec![n]),
            ("finished", Dtype::U8, vec![n]),
            (
                "taps",
                Dtype::F16,
                vec![self.ids.len(), manifest.tap_width()],
            ),
        ];
        let tensors = layout
            .into_iter()
            .zip(&bytes)
            .map(|((name, dtype, shape), bytes)| {
                (
                    name,
                    Raw {
                        dtype,
                        shape,
                        bytes,
                    },
                )
            });
        let info = HashMap::from([
            ("format".to_string(), FORMAT.to_string()),
            (
                "tap_layers".to_string(),
                serde_json::to_string(&manifest.tap_layers)?,
            ),
            ("n_embd".to_string(), manifest.n_embd.to_string()),
        ]);
        let tmp = path.with_extension("partial");
        safetensors::serialize_to_file(tensors, Some(info), &tmp)
            .with_context(|| format!("cannot write {}", tmp.display()))?;
        std::fs::rename(&tmp, path)
            .with_context(|| format!("cannot rename {} to {}", tmp.display(), path.display()))?;
        Ok(())
    }
}

/// What a complete shard holds, after checking that it is what its manifest
/// promises: every tensor present with consistent shapes and offsets.
#[derive(Debug, PartialEq)]
pub struct ShardSummary {
    pub sequences: usize,
    pub tokens: usize,
    pub response_tokens: usize,
}

pub fn check_shard(path: &Path, manifest: &Manifest) -> Result<ShardSummary> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    check_shard_bytes(&bytes, manifest).with_context(|| {
        format!(
            "{} is corrupt or truncated; delete it to generate it again",
            path.display()
        )
    })
}

fn check_shard_bytes(bytes: &[u8], manifest: &Manifest) -> Result<ShardSummary> {
    let st = SafeTensors::deserialize(bytes)?;
    let tensor = |name: &str, dtype: Dtype| -> Result<(Vec<usize>, &[u8])> {
        let t = st
            .tensor(name)
            .with_context(|| format!("no tensor {name}"))?;
        ensure!(
            t.dtype() == dtype,
            "{name} is {:?}, not {dtype:?}",
            t.dtype()
        );
        Ok((t.shape().to_vec(), t.data()))
    };
    let (ids_shape, _) = tensor("input_ids", Dtype::I32)?;
    let (off_shape, off) = tensor("seq_offsets", Dtype::I64)?;
    let (pl_shape, pl) = tensor("prompt_lens", Dtype::I32)?;
    let (taps_shape, _) = tensor("taps", Dtype::F16)?;
    tensor("prompt_index", Dtype::I32)?;
    tensor("finished", Dtype::U8)?;
    ensure!(ids_shape.len() == 1 && off_shape.len() == 1 && pl_shape.len() == 1);
    let (n_tokens, n) = (ids_shape[0], pl_shape[0]);
    ensure!(
        off_shape[0] == n + 1,
        "seq_offsets has {} entries for {n} sequences",
        off_shape[0]
    );
    ensure!(
        taps_shape == [n_tokens, manifest.tap_width()],
        "taps are {taps_shape:?}, expected [{n_tokens}, {}]",
        manifest.tap_width()
    );
    let offsets: Vec<i64> = off
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let prompt_lens: Vec<i32> = pl
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    ensure!(
        offsets.first() == Some(&0) && offsets.last() == Some(&(n_tokens as i64)),
        "seq_offsets do not span input_ids"
    );
    let mut response_tokens = 0;
    for (i, w) in offsets.windows(2).enumerate() {
        let len = w[1] - w[0];
        ensure!(
            len > 0 && (0..len).contains(&(prompt_lens[i] as i64)),
            "sequence {i} has {len} tokens and a prompt of {}",
            prompt_lens[i]
        );
        response_tokens += (len - prompt_lens[i] as i64) as usize;
    }
    Ok(ShardSummary {
        sequences: n,
        tokens: n_tokens,
        response_tokens,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest() -> Manifest {
        Manifest {
            format: FORMAT.into(),
            model_name: "m".into(),
            architecture: "llama".into(),
            n_layer: 4,
            n_embd: 3,
            n_vocab: 100,
            tap_layers: vec![1, 3],
            template_hash: fnv1a(b"t"),
            system: None,
            prompts_hash: fnv1a(b"p"),
            n_prompts: 5,
            shard_size: 2,
            max_new_tokens: 8,
            max_prompt_tokens: 64,
            kv_type: "f16".into(),
        }
    }

    fn sequence(prompt_index: usize, len: usize, prompt_len: usize) -> Sequence {
        Sequence {
            prompt_index,
            ids: (0..len as u32).collect(),
            prompt_len,
            finished: true,
            taps: (0..len * 6).map(|i| f16::from_f32(i as f32)).collect(),
        }
    }

    #[test]
    fn a_written_shard_reads_back_with_its_layout() {
        let dir = std::env::temp_dir().join(format!("bd-shard-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let m = manifest();
        let mut b = ShardBuilder::default();
        b.push(sequence(0, 5, 2));
        b.push(sequence(1, 3, 1));
        let path = shard_path(&dir, 0);
        b.write(&path, &m).unwrap();
        let s = check_shard(&path, &m).unwrap();
        assert_eq!(
            s,
            ShardSummary {
                sequences: 2,
                tokens: 8,
                response_tokens: 5
            }
        );
        let bytes = std::fs::read(&path).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let taps = st.tensor("taps").unwrap();
        assert_eq!(taps.shape(), [8, 6]);
        // Row 5 is the first row of the second sequence: its first value.
        let row5 = &taps.data()[5 * 6 * 2..5 * 6 * 2 + 2];
        assert_eq!(f16::from_le_bytes([row5[0], row5[1]]).to_f32(), 0.0);
        assert!(!dir.join("shard-00000.partial").exists());

        // A truncated shard is reported, with its path, as corrupt.
        std::fs::write(&path, &bytes[..bytes.len() - 10]).unwrap();
        let err = format!("{:#}", check_shard(&path, &m).unwrap_err());
        assert!(err.contains("corrupt or truncated"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_resumed_run_must_match_the_manifest() {
        let m = manifest();
        let dir = Path::new("/data");
        m.check_resumable(&m.clone(), dir).unwrap();
        let mut other = m.clone();
        other.tap_layers = vec![1, 2];
        let err = other.check_resumable(&m, dir).unwrap_err().to_string();
        assert!(err.contains("tap_layers = [1,3]"), "{err}");
        assert_eq!(m.n_shards(), 3);
    }
}
