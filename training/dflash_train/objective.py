"""The training objective of shared/spec/dflash-reference.md §3.2: anchors
among supervised positions, same-position labels, exp(−(k−1)/γ) weights."""
import torch
import torch.nn.functional as F


def valid_anchors(loss_mask: torch.Tensor) -> torch.Tensor:
    """Positions a with a and a+1 both supervised (response tokens)."""
    m = loss_mask[:-1] & loss_mask[1:]
    return torch.nonzero(m).flatten()


def sample_anchors(loss_mask, n, generator):
    cand = valid_anchors(loss_mask)
    if len(cand) > n:
        cand = cand[torch.randperm(len(cand), generator=generator)[:n]]
    return cand.sort().values


def labels_and_weights(ids, loss_mask, anchors, block_size, gamma):
    """For slots k = 1..B−1 of each block: label ids[a+k] and weight
    loss_mask[a+k]·exp(−(k−1)/γ), zero past the sequence's end."""
    S = len(ids)
    k = torch.arange(1, block_size)
    pos = anchors[:, None] + k[None, :]  # [A, B−1]
    inside = pos < S
    pos_c = pos.clamp(max=S - 1)
    labels = ids[pos_c]
    w = torch.exp(-(k - 1).float() / gamma)[None, :] * inside * loss_mask[pos_c]
    return labels, w


def block_loss(hidden, head, labels, weights):
    """Σ w·CE(head(hidden), label) / Σ w over the full vocabulary, and the
    per-slot argmax hits [A, B−1]. Rows of weight 0 never reach the head."""
    A, K, H = hidden.shape
    w = weights.reshape(-1)
    keep = w > 0
    logits = hidden.reshape(-1, H)[keep] @ head.T
    y = labels.reshape(-1)[keep]
    ce = F.cross_entropy(logits, y, reduction="none")
    hits = torch.zeros(A * K, dtype=torch.bool)
    hits[keep] = logits.detach().argmax(-1) == y
    return (ce * w[keep]).sum() / w.sum().clamp(min=1e-9), hits.reshape(A, K)


def accept_length(hits, weights):
    """Offline τ proxy per block: 1 + the length of the correct prefix."""
    ok = hits & (weights > 0)
    return 1 + torch.cumprod(ok.int(), dim=1).sum(1).float()
