"""Unit tests of the trainer: the attention mask, labels and loss against a
dense per-query reference, and the data checks. Run: python3 -m unittest
discover -s training (from the repository root)."""
import math
import sys
import tempfile
import unittest
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dflash_train.data import DataError, load_shards, read_manifest  # noqa: E402
from dflash_train.model import DFlyDrafter, Drafter, DrafterConfig, rope  # noqa: E402
from dflash_train.objective import (accept_length, block_loss,  # noqa: E402
                                    labels_and_weights, valid_anchors)

H, V, B, S = 16, 50, 4, 12


def tiny(layers=1):
    torch.manual_seed(0)
    cfg = DrafterConfig(hidden_size=H, intermediate_size=24, num_hidden_layers=layers,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                        target_layer_ids=[0, 2], num_target_layers=4, mask_token_id=V - 1,
                        vocab_size=V, block_size=B, rope_theta=1e4)
    m = Drafter(cfg)
    with torch.no_grad():  # non-trivial norms, so a skipped norm shows
        for p in m.parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)
    return m, cfg


def dense_reference(m: Drafter, taps, ids, anchors, embed):
    """One query at a time: block b sees context keys j < a_b and its own
    block's keys, nothing else (shared/spec/dflash-reference.md §3.2)."""
    c = m.config
    ctx = m.hidden_norm(m.fc(taps.float()))
    outs = []
    for a in anchors.tolist():
        blk = torch.tensor([ids[a].item()] + [c.mask_token_id] * (B - 1))
        h = embed[blk]
        pos = torch.arange(a, a + B)
        for layer in m.layers:
            at = layer.self_attn
            x = layer.input_layernorm(h)
            keys_src = torch.cat([ctx[:a], x])  # context strictly before a, then the block
            key_pos = torch.cat([torch.arange(a), pos])
            q = rope(at.q_norm(at.q_proj(x).view(B, c.num_attention_heads, c.head_dim)), pos, c.rope_theta)
            k, v = at.kv(keys_src, key_pos)
            o = torch.zeros(B, c.num_attention_heads, c.head_dim)
            g = c.num_attention_heads // c.num_key_value_heads
            for i in range(B):
                for hh in range(c.num_attention_heads):
                    s = torch.stack([q[i, hh] @ k[j, hh // g] for j in range(len(k))]) / math.sqrt(c.head_dim)
                    o[i, hh] = torch.softmax(s, 0) @ v[:, hh // g]
            h = h + at.o_proj(o.reshape(B, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        outs.append(m.norm(h)[1:])
    return torch.stack(outs)


class DrafterForward(unittest.TestCase):
    def setUp(self):
        self.m, self.cfg = tiny(layers=2)
        g = torch.Generator().manual_seed(1)
        self.taps = torch.randn(S, 2 * H, generator=g).half()
        self.ids = torch.randint(0, V - 1, (S,), generator=g)
        self.embed = torch.randn(V, H, generator=g)
        self.anchors = torch.tensor([0, 3, 7, 10])

    def test_matches_dense_per_query_reference(self):
        with torch.no_grad():
            got = self.m(self.taps, self.ids, self.anchors, self.embed)
            want = dense_reference(self.m, self.taps, self.ids, self.anchors, self.embed)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)

    def test_a_block_sees_the_context_strictly_before_its_anchor(self):
        a = 7
        i = self.anchors.tolist().index(a)
        with torch.no_grad():
            base = self.m(self.taps, self.ids, self.anchors, self.embed)[i]
            later = self.taps.clone()
            later[a:] += 1.0  # the anchor's own position and after: invisible
            same = self.m(later, self.ids, self.anchors, self.embed)[i]
            earlier = self.taps.clone()
            earlier[a - 1] += 1.0  # the position just before: visible
            changed = self.m(earlier, self.ids, self.anchors, self.embed)[i]
        torch.testing.assert_close(base, same)
        self.assertGreater((base - changed).abs().max().item(), 1e-3)

    def test_blocks_are_independent_and_bidirectional(self):
        with torch.no_grad():
            one = self.m(self.taps, self.ids, self.anchors[1:2], self.embed)
            all_ = self.m(self.taps, self.ids, self.anchors, self.embed)
        torch.testing.assert_close(one[0], all_[1])
        # Slot 1 depends on slot 3's input (bidirectional within the block):
        # changing the mask embedding moves every slot; changing the anchor
        # token moves them too.
        ids2 = self.ids.clone()
        ids2[3] = (ids2[3] + 1) % (V - 1)
        with torch.no_grad():
            moved = self.m(self.taps, ids2, self.anchors[1:2], self.embed)
        self.assertGreater((one - moved).abs().amax(dim=-1).min().item(), 1e-4)


def tiny_dfly(correction=True, layers=2):
    torch.manual_seed(0)
    extra = {"enable_hidden_correction": True, "hidden_correction_intermediate_size": 20} if correction else {}
    cfg = DrafterConfig(hidden_size=H, intermediate_size=24, num_hidden_layers=layers,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                        target_layer_ids=[0, 1, 2], num_target_layers=4, mask_token_id=V - 1,
                        vocab_size=V, block_size=B, rope_theta=1e4, extra=extra)
    m = DFlyDrafter(cfg)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)
    return m


class DFly(unittest.TestCase):
    """DFly against its formulas (shared/spec/dflash-family.md §3.5)."""

    def setUp(self):
        g = torch.Generator().manual_seed(2)
        self.taps = torch.randn(S, 3 * H, generator=g).half()
        self.ids = torch.randint(0, V - 1, (S,), generator=g)
        self.embed = torch.randn(V, H, generator=g)
        self.anchors = torch.tensor([0, 3, 7])

    def test_each_layer_reads_its_own_fusion_of_the_raw_taps(self):
        m = tiny_dfly()
        with torch.no_grad():
            m.layer_fusion_weights.copy_(torch.tensor([[0.3, -1.0, 2.0], [1.5, 0.0, -0.5]]))
            ctxs = m.contexts(self.taps)
        x = self.taps.float()
        for l, ctx in enumerate(ctxs):
            w = torch.softmax(m.layer_fusion_weights[l], 0)
            mix = sum(w[t] * x[:, t * H:(t + 1) * H] for t in range(3))
            want = m.context_norm(m.fc(x) + mix)
            torch.testing.assert_close(ctx, want)
        self.assertGreater((ctxs[0] - ctxs[1]).abs().max().item(), 1e-3)

    def test_the_correction_starts_as_the_identity(self):
        m = tiny_dfly(correction=True)
        bare = tiny_dfly(correction=False)
        bare.load_state_dict({k: v for k, v in m.state_dict().items() if not k.startswith("hidden_correction.")})
        with torch.no_grad():
            on = m(self.taps, self.ids, self.anchors, self.embed)
            off = bare(self.taps, self.ids, self.anchors, self.embed)
        torch.testing.assert_close(on, off)

    def test_slot_k_is_corrected_by_the_token_before_it(self):
        m = tiny_dfly()
        with torch.no_grad():
            m.hidden_correction.down_proj.weight.normal_(0, 0.5)
            base = m(self.taps, self.ids, self.anchors[1:2], self.embed)[0]
            ids = self.ids.clone()
            a = 3
            ids[a + 1] = (ids[a + 1] + 1) % (V - 1)  # slot 1's label, slot 2's predecessor
            moved = m(self.taps, ids, self.anchors[1:2], self.embed)[0]
            h = Drafter.forward(m, self.taps, self.ids, self.anchors[1:2], self.embed)[0]
        diff = (base - moved).abs().amax(-1)
        self.assertEqual(diff[0].item(), 0.0)  # slot 1: the anchor before it
        self.assertGreater(diff[1].item(), 1e-3)  # slot 2
        self.assertEqual(diff[2:].abs().max().item(), 0.0)
        hc = m.hidden_correction
        e = self.embed[self.ids[a + 1]]
        u = torch.cat([hc.hidden_norm(h[1]), hc.embed_norm(e)])
        torch.testing.assert_close(base[1], h[1] + hc.down_proj(F.silu(hc.gate_proj(u)) * hc.up_proj(u)))


class AgainstPyPIReference(unittest.TestCase):
    """The trainer's forward is the PyPI `dflash` 0.1.0 DFlashDraftModel's:
    same tensors, same block hidden states (context = positions < anchor)."""

    def test_block_hidden_states_match_dflash(self):
        try:
            from dflash.model import DFlashDraftModel
            from transformers import Qwen3Config
        except ImportError:
            self.skipTest("PyPI dflash 0.1.0 / transformers not installed (.ci/run installs them)")
        m, c = tiny(layers=2)
        hf = c.hf_config()
        cfg = Qwen3Config(**{k: v for k, v in hf.items() if k not in ("architectures", "dflash_config")})
        cfg.dflash_config = hf["dflash_config"]
        cfg._attn_implementation = "eager"
        ref = DFlashDraftModel(cfg).float().eval()
        missing, unexpected = ref.load_state_dict(m.state_dict(), strict=False)
        self.assertEqual((unexpected, [k for k in missing if "rotary" not in k]), ([], []))
        g = torch.Generator().manual_seed(3)
        taps = torch.randn(S, 2 * H, generator=g)
        ids = torch.randint(0, V - 1, (S,), generator=g)
        embed = torch.randn(V, H, generator=g)
        anchors = torch.tensor([1, 6, 11])
        with torch.no_grad():
            ours = m(taps, ids, anchors, embed)
            for i, a in enumerate(anchors.tolist()):
                blk = torch.tensor([int(ids[a])] + [c.mask_token_id] * (B - 1))
                want = ref(position_ids=torch.arange(a + B)[None], noise_embedding=embed[blk][None],
                           target_hidden=taps[:a][None])[0, 1:]
                torch.testing.assert_close(ours[i], want, atol=1e-5, rtol=1e-5)


class Objective(unittest.TestCase):
    def test_labels_are_the_tokens_at_the_same_position(self):
        ids = torch.arange(100, 110)
        mask = torch.tensor([0, 0, 0, 1, 1, 1, 1, 1, 1, 1], dtype=torch.bool)
        anchors = valid_anchors(mask)
        self.assertEqual(anchors.tolist(), [3, 4, 5, 6, 7, 8])
        labels, w = labels_and_weights(ids, mask, anchors, 4, gamma=4.0)
        # Slot k of the block at a is labelled with token a+k (not a+k+1).
        for b, a in enumerate(anchors.tolist()):
            for k in range(1, 4):
                if a + k < len(ids):
                    self.assertEqual(labels[b, k - 1].item(), ids[a + k].item())
                    self.assertAlmostEqual(w[b, k - 1].item(), math.exp(-(k - 1) / 4.0), places=6)
                else:
                    self.assertEqual(w[b, k - 1].item(), 0.0)

    def test_prompt_tokens_carry_no_weight(self):
        ids = torch.arange(8)
        mask = torch.tensor([0, 1, 1, 0, 0, 1, 1, 1], dtype=torch.bool)
        labels, w = labels_and_weights(ids, mask, torch.tensor([1]), 4, gamma=7.0)
        self.assertEqual((w[0] > 0).tolist(), [True, False, False])

    def test_loss_is_the_weighted_mean_cross_entropy(self):
        g = torch.Generator().manual_seed(2)
        hidden = torch.randn(3, 2, H, generator=g)
        head = torch.randn(V, H, generator=g)
        labels = torch.randint(0, V, (3, 2), generator=g)
        w = torch.tensor([[1.0, 0.5], [0.0, 0.25], [1.0, 0.0]])
        loss, hits = block_loss(hidden, head, labels, w)
        logits = hidden @ head.T
        ce = F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), reduction="none").reshape(3, 2)
        self.assertAlmostEqual(loss.item(), ((ce * w).sum() / w.sum()).item(), places=5)
        self.assertEqual(hits.tolist(), ((logits.argmax(-1) == labels) & (w > 0)).tolist())

    def test_accept_length_counts_the_correct_prefix(self):
        hits = torch.tensor([[True, True, False], [False, True, True], [True, True, True]])
        w = torch.ones(3, 3)
        self.assertEqual(accept_length(hits, w).tolist(), [3.0, 1.0, 4.0])


class ReducedVocabulary(unittest.TestCase):
    def test_draft_vocabulary_keeps_the_most_frequent_response_tokens(self):
        import train
        from dflash_train.data import Sequence
        seqs = [Sequence(torch.tensor([9, 9, 9, 5, 5, 7, 3]), 1, torch.zeros(7, 1)),
                Sequence(torch.tensor([9, 3, 3, 8]), 2, torch.zeros(4, 1)),
                Sequence(torch.tensor([20, 1]), 1, torch.zeros(2, 1))]
        # 8 x response count + count: 9 -> 20, 3 -> 19, 5 -> 18, 1, 7, 8 -> 9
        # (a tie: lower ids first), 20 (prompt only) -> 1, the rest 0; ids
        # ascending.
        self.assertEqual(train.draft_vocab(seqs, 3, V).tolist(), [3, 5, 9])
        self.assertEqual(train.draft_vocab(seqs, 5, V).tolist(), [1, 3, 5, 7, 9])
        self.assertEqual(train.draft_vocab(seqs, 7, V).tolist(), [1, 3, 5, 7, 8, 9, 20])
        # Beyond what the data shows: the lowest ids.
        self.assertEqual(train.draft_vocab(seqs, 8, V).tolist(), [0, 1, 3, 5, 7, 8, 9, 20])

    def test_a_reduced_head_scores_its_rows_and_ignores_labels_outside_it(self):
        import train
        torch.manual_seed(3)
        head = torch.randn(V, H)
        d2t = torch.tensor([2, 7, 11, 40])
        dh = train.DraftHead(head, d2t)
        self.assertTrue(torch.equal(dh.weight, head[d2t]))
        labels = torch.tensor([[7, 3], [40, 2]])
        w = torch.ones(2, 2)
        rows, w2 = dh.labels(labels, w)
        self.assertEqual(rows.tolist(), [[1, 0], [3, 0]])
        self.assertEqual(w2.tolist(), [[1, 0], [1, 1]])  # 3 is outside: no weight
        hidden = torch.randn(2, 2, H)
        loss, hits = block_loss(hidden, dh.weight, rows, w2)
        # The loss is the cross-entropy over the reduced head's 4 rows.
        logits = hidden @ head[d2t].T
        ce = F.cross_entropy(logits.reshape(-1, 4), rows.reshape(-1), reduction="none").reshape(2, 2)
        self.assertAlmostEqual(loss.item(), ((ce * w2).sum() / w2.sum()).item(), places=5)
        # A label outside the vocabulary is never a hit, so the tau proxy
        # stops there.
        self.assertFalse(bool(hits[0, 1]))
        # The full head is the identity mapping.
        full = train.DraftHead(head)
        self.assertTrue(torch.equal(full.labels(labels, w)[0], labels))

    def test_trimming_keeps_the_most_used_rows_unchanged(self):
        import trim_vocab
        from dflash_train.data import Sequence
        torch.manual_seed(5)
        d2t = torch.tensor([1, 3, 5, 7, 9])
        head = torch.randn(5, H)
        tensors = {"d2t": d2t, "lm_head.weight": head, "fc.weight": torch.randn(2, 2)}
        seqs = [Sequence(torch.tensor([9, 9, 9, 5, 5, 7, 3]), 1, torch.zeros(0))]
        out, cfg = trim_vocab.trim(tensors, {"vocab_size": V, "draft_vocab_size": 5}, 3, seqs)
        # Scores: 9 -> 24, 5 -> 18, 7 and 3 -> 9 (3 first), 1 -> 0.
        self.assertEqual(out["d2t"].tolist(), [3, 5, 9])
        self.assertTrue(torch.equal(out["lm_head.weight"], head[[1, 2, 4]]))
        self.assertIs(out["fc.weight"], tensors["fc.weight"])
        self.assertEqual(cfg["draft_vocab_size"], 3)
        with self.assertRaises(ValueError):
            trim_vocab.trim(tensors, {"vocab_size": V}, 6, seqs)


    def test_a_shipped_drafter_reads_back_as_its_checkpoint(self):
        import os
        import trim_vocab
        from dflash_train.target import read_target
        models = Path(os.environ.get("BLOCKDRAFT_MODELS", Path.home() / ".cache/blockdraft/models"))
        target = models / "smollm2-135m-instruct-q4_1.gguf"
        if not target.exists():
            self.skipTest(f"SKIPPED: {target} is not in the model cache (tests/fetch_models.sh)")
        shipped = Path(__file__).resolve().parents[1] / "drafters" / "smollm2-dflash.gguf"
        tensors, cfg = trim_vocab.from_gguf(shipped, target)
        _, head, info = read_target(target)
        d2t = tensors["d2t"]
        self.assertEqual(cfg["draft_vocab_size"], len(d2t))
        self.assertEqual(cfg["vocab_size"], head.shape[0])
        self.assertEqual(cfg["target_num_hidden_layers"], info["n_layer"])
        self.assertTrue(torch.equal(tensors["lm_head.weight"], head[d2t]))
        self.assertIn("layers.0.mlp.down_proj.weight", tensors)
        with self.assertRaises(trim_vocab.DrafterFileError):
            trim_vocab.from_gguf(target, target)  # not a drafter


class Data(unittest.TestCase):
    def test_truncated_and_missing_data_fail_clearly(self):
        from safetensors.torch import save_file
        with tempfile.TemporaryDirectory() as d:
            d = Path(d)
            with self.assertRaisesRegex(DataError, "not a gen-data manifest"):
                read_manifest(d)
            (d / "manifest.json").write_text(
                '{"format": "blockdraft-taps/1", "tap_layers": [1], "n_embd": 2}')
            m = read_manifest(d)
            with self.assertRaisesRegex(DataError, "no shards"):
                load_shards(d, m)
            save_file({"input_ids": torch.tensor([1, 2, 3], dtype=torch.int32),
                       "seq_offsets": torch.tensor([0, 3]),
                       "prompt_lens": torch.tensor([1], dtype=torch.int32),
                       "taps": torch.zeros(3, 2, dtype=torch.float16)},
                      str(d / "shard-00000.safetensors"),
                      metadata={"format": "blockdraft-taps/1", "tap_layers": "[1]"})
            seqs = load_shards(d, m)
            self.assertEqual([len(s.ids) for s in seqs], [3])
            raw = (d / "shard-00000.safetensors").read_bytes()
            (d / "shard-00000.safetensors").write_bytes(raw[:-7])
            with self.assertRaisesRegex(DataError, "corrupt or truncated"):
                load_shards(d, m)

    def test_sequences_export_the_token_ids_in_prompt_order(self):
        import json
        import subprocess
        from safetensors.torch import save_file
        with tempfile.TemporaryDirectory() as d:
            d = Path(d)
            manifest = {"format": "blockdraft-taps/1", "tap_layers": [1], "n_embd": 2}
            (d / "manifest.json").write_text(json.dumps(manifest))
            for k, (index, ids) in enumerate([([2, 3], [[5, 6, 7], [8, 9]]), ([0], [[1, 2, 3, 4]])]):
                flat = [t for seq in ids for t in seq]
                offsets = [0]
                for seq in ids:
                    offsets.append(offsets[-1] + len(seq))
                save_file({"input_ids": torch.tensor(flat, dtype=torch.int32),
                           "seq_offsets": torch.tensor(offsets),
                           "prompt_lens": torch.ones(len(ids), dtype=torch.int32),
                           "prompt_index": torch.tensor(index, dtype=torch.int32),
                           "finished": torch.tensor([1] * len(ids), dtype=torch.uint8),
                           "taps": torch.zeros(len(flat), 2, dtype=torch.float16)},
                          str(d / f"shard-{k:05}.safetensors"))
            out = d / "seqs.jsonl"
            script = Path(__file__).resolve().parent / "sequences.py"
            subprocess.run([sys.executable, str(script), str(d), "-o", str(out)], check=True,
                           capture_output=True)
            lines = [json.loads(line) for line in out.read_text().splitlines()]
            self.assertEqual(lines[0], {"manifest": manifest})
            self.assertEqual([(x["prompt_index"], x["ids"]) for x in lines[1:]],
                             [(0, [1, 2, 3, 4]), (2, [5, 6, 7]), (3, [8, 9])])
            self.assertTrue(all(x["prompt_len"] == 1 and x["finished"] for x in lines[1:]))


class WarmStart(unittest.TestCase):
    """`train.py --init-from`: a shipped drafter's weights become the
    trainer's starting point, exactly, and only for data it was made for."""
    SHIPPED = Path(__file__).resolve().parents[1] / "drafters" / "smollm2-dflash.gguf"

    def args(self, **flags):
        import argparse
        base = {"init_from": self.SHIPPED, "layers": None, "intermediate": None, "heads": None,
                "kv_heads": None, "head_dim": None, "block": None, "mask_token": None,
                "variant": "dflash"}
        return argparse.Namespace(**{**base, **flags})

    def manifest(self, taps=(2, 9, 15, 21, 28)):
        return {"tap_layers": list(taps), "n_embd": 576}

    def test_the_shipped_drafter_loads_into_the_trainers_model(self):
        from gguf import GGUFReader
        from gguf.quants import dequantize
        import train
        args = self.args()
        weights = train.warm_start(args, self.manifest())
        self.assertEqual((args.layers, args.block, args.mask_token, args.heads, args.kv_heads),
                         (1, 8, 16, 9, 3))
        # Its reduced vocabulary comes along (distinct target ids, ascending).
        d2t = args.init_d2t
        self.assertEqual(len(d2t), 13824)
        self.assertTrue(bool((d2t[1:] > d2t[:-1]).all()) and int(d2t[-1]) < 49152)
        cfg = DrafterConfig(hidden_size=576, intermediate_size=args.intermediate,
                            num_hidden_layers=args.layers, num_attention_heads=args.heads,
                            num_key_value_heads=args.kv_heads, head_dim=args.head_dim,
                            target_layer_ids=[1, 8, 14, 20, 27], num_target_layers=30,
                            mask_token_id=args.mask_token, vocab_size=49152, block_size=args.block)
        model = Drafter(cfg)
        model.load_state_dict(weights, strict=True)  # every tensor, no extra
        fc = next(t for t in GGUFReader(str(self.SHIPPED)).tensors if t.name == "fc.weight")
        expected = torch.from_numpy(dequantize(fc.data, fc.tensor_type).copy()).float()
        self.assertTrue(torch.equal(model.fc.weight.detach(), expected))

    def test_added_layers_start_as_identities(self):
        import train
        args = self.args(layers=2)
        weights = train.warm_start(args, self.manifest())
        self.assertEqual((args.layers, args.init_layers), (2, 1))

        def drafter(layers):
            return Drafter(DrafterConfig(
                hidden_size=576, intermediate_size=args.intermediate, num_hidden_layers=layers,
                num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                head_dim=args.head_dim, target_layer_ids=[1, 8, 14, 20, 27], num_target_layers=30,
                mask_token_id=args.mask_token, vocab_size=49152, block_size=args.block))
        torch.manual_seed(0)
        one, two = drafter(1), drafter(2)
        one.load_state_dict(weights, strict=True)
        missing, unexpected = two.load_state_dict(weights, strict=False)
        self.assertTrue(missing and all(k.startswith("layers.1.") for k in missing) and not unexpected)
        train.grow_layers(two, 1)
        # The grown drafter's block states are the file's, exactly.
        taps, ids = torch.randn(20, 5 * 576), torch.randint(0, 64, (20,))
        anchors, embed = torch.tensor([3, 10]), torch.randn(64, 576)
        with torch.no_grad():
            self.assertTrue(torch.equal(two(taps, ids, anchors, embed), one(taps, ids, anchors, embed)))
        # Not an identity that stays one: the new layer's projections learn.
        self.assertGreater(float(two.layers[1].self_attn.q_proj.weight.detach().abs().sum()), 0.0)

    def test_a_dfly_run_starts_from_a_v1_drafter(self):
        import train
        args = self.args(variant="dfly")
        weights = train.warm_start(args, self.manifest())
        self.assertIsNone(args.init_d2t)  # DFly drafts over the whole vocabulary
        self.assertNotIn("hidden_norm.weight", weights)
        cfg = DrafterConfig(hidden_size=576, intermediate_size=args.intermediate, num_hidden_layers=1,
                            num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                            head_dim=args.head_dim, target_layer_ids=[1, 8, 14, 20, 27],
                            num_target_layers=30, mask_token_id=args.mask_token, vocab_size=49152,
                            extra={"enable_hidden_correction": True})
        m = DFlyDrafter(cfg)
        missing, unexpected = m.load_state_dict(weights, strict=False)
        self.assertEqual(unexpected, [])
        self.assertTrue(all(k == "layer_fusion_weights" or k.startswith("hidden_correction.") for k in missing),
                        missing)
        torch.testing.assert_close(m.context_norm.weight, weights["context_norm.weight"])

    def test_a_warm_start_may_train_on_another_block_length(self):
        import train
        args = self.args(block=16)
        weights = train.warm_start(args, self.manifest())
        self.assertEqual(args.block, 16)  # not the file's 8: the block shapes no weight
        self.assertIn("fc.weight", weights)
        # Other shape flags that disagree with the file are still refused.
        from dflash_train.gguf_drafter import DrafterFileError
        with self.assertRaisesRegex(DrafterFileError, "--heads 4, the file has 9"):
            train.warm_start(self.args(block=16, heads=4), self.manifest())

    def test_a_drafter_for_other_data_or_shape_is_refused(self):
        import train
        from dflash_train.gguf_drafter import DrafterFileError
        with self.assertRaisesRegex(DrafterFileError, "taps"):
            train.warm_start(self.args(), self.manifest(taps=(2, 9, 15, 21, 29)))
        with self.assertRaisesRegex(DrafterFileError, "--layers 0, the file has 1"):
            train.warm_start(self.args(layers=0), self.manifest())
        with self.assertRaisesRegex(DrafterFileError, "not a readable GGUF"):
            with tempfile.NamedTemporaryFile(suffix=".gguf") as f:
                f.write(b"GGUF-not-really")
                f.flush()
                train.warm_start(self.args(init_from=Path(f.name)), self.manifest())


if __name__ == "__main__":
    unittest.main()


class LibraryPrompts(unittest.TestCase):
    """prompts.py's `code-lib` source: documented public methods of
    top-level classes and top-level functions, nothing private, nothing
    undocumented, nothing under a tests directory."""

    def test_methods_and_functions_become_prompts(self):
        import prompts
        src = '''
def area(w, h=1):
    """Return the area of a w by h rectangle, in square units of w.

    More text that is not the summary."""

def _private(x):
    """A private helper that is long enough to be documented."""

def short(x):
    """Too short."""

class Stack:
    def push(self, item):
        """Put item on the top of the stack and return its new size."""
    def _grow(self):
        """Private: doubles the capacity of the backing list."""

class _Hidden:
    def visible(self):
        """A public method of a private class is left out too."""
'''
        with tempfile.TemporaryDirectory() as d:
            root = Path(d)
            (root / "mod.py").write_text(src)
            (root / "tests").mkdir()
            (root / "tests" / "t.py").write_text(src)
            paths = sorted(root.rglob("*.py"))
            got = list(prompts.library_prompts(root, paths))
            methods_only = list(prompts.library_prompts(root, paths, functions=False))
        self.assertEqual(got, [
            "Write a Python function `area(w, h=1)`. Return the area of a w by h rectangle, "
            "in square units of w.",
            "Write the method `push(self, item)` of a Python class `Stack`. Put item on the top "
            "of the stack and return its new size.",
        ])
        self.assertEqual(methods_only, got[1:])
