// dump_logits: reference logits of llama.cpp (34af94cd, CPU) for a `qwen35` GGUF.
//
// usage: dump_logits MODEL.gguf OUT.json [--threads N] [--strict] [--lenient] [--verbose]
//
// Context: n_ctx 256, n_batch = n_ubatch = 256, n_seq_max 1, n_rs_seq 8, F32 K/V cache,
// flash attention off, CPU only. Token ids come from a fixed LCG (see Lcg), uniform in
// [0, n_vocab), drawn in this order: prompt, decode steps, per trial batch then next,
// single-step rollback steps then next. L = 124 (prompt + decode steps).
//   prefill   120 prompt tokens in one llama_decode, logits for every row
//   decode    4 single-token decodes
//   rollback  for keep in 0..4: from the state at L decode 5 tokens (logits for all rows),
//             seq_rm(L + keep), decode `next` at L + keep
//   single_step_rollback: from L, 3 single-token decodes, seq_rm(L + 1), decode `next` at L + 1
//
// llama.cpp 34af94cd restores a correct recurrent state after a partial seq_rm only when the
// rollback r satisfies 1 <= r < (tokens in the last llama_decode call): the gated-delta-net op
// writes snapshot slots 0..n-1 only (slot s = state after n-s tokens), and every other slot
// keeps whatever an earlier decode left there. So rolling back a whole batch (keep = 0),
// rolling back after a single-token decode (single_step_rollback) and seq_rm back to L after
// `next` all restore stale state (relative logit errors ~0.3-0.8 here).
// Default mode: every trial starts in a fresh context replayed to L (same calls as (b), (c):
// bit-identical state); keep 1..4 record llama.cpp's rollback path; keep 0 and
// single_step_rollback record a replay without rollback (the llama.cpp seq_rm path is still run
// and its error printed as info). --strict: the literal protocol (one context, seq_rm back to L
// between trials, llama.cpp's rollback everywhere); fails its self-check on 34af94cd.
//
// Self-check: every recorded `next` (and every batch row) is recomputed in a fresh context
// (everything before it and the token itself in one llama_decode); the max relative difference
// max|a - b| / max|b| is printed on stderr. Exit code 1 if a check exceeds 1e-3 (with
// --lenient only keep = 2 and single_step_rollback count); the JSON then goes to
// OUT.json.failed instead of OUT.json.
//
// JSON: {"n_vocab", "prompt", "prefill", "decode", "rollback", "single_step_rollback"},
// floats printed with 9 significant digits.

#include "llama.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr int      N_CTX      = 256;
constexpr int      N_PROMPT   = 120;
constexpr int      N_DECODE   = 4;
constexpr int      N_BATCH_RB = 5;   // rollback trial batch
constexpr int      N_KEEP_MAX = 4;   // keep in 0..=4
constexpr int      N_STEPS_SS = 3;   // single-step rollback: steps
constexpr int      KEEP_SS    = 1;   // single-step rollback: kept steps
constexpr uint32_t N_RS_SEQ   = 8;
constexpr double   TOL        = 1e-3;
constexpr uint64_t LCG_SEED   = 0x5EED0035ULL;

bool g_verbose = false;

void log_cb(ggml_log_level level, const char * text, void * /*user*/) {
    if (g_verbose || level == GGML_LOG_LEVEL_ERROR || level == GGML_LOG_LEVEL_WARN) {
        fputs(text, stderr);
    }
}

[[noreturn]] void die(const char * fmt, const char * what = "") {
    fprintf(stderr, "dump_logits: error: ");
    fprintf(stderr, fmt, what);
    fprintf(stderr, "\n");
    exit(1);
}

// Knuth MMIX LCG; token = high 32 bits scaled to [0, n) by multiply-shift.
struct Lcg {
    uint64_t s;
    explicit Lcg(uint64_t seed) : s(seed) {}
    llama_token next(int n) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        return (llama_token) (((s >> 32) * (uint64_t) n) >> 32);
    }
};

using Logits = std::vector<float>;

struct Runner {
    llama_model * model;
    int n_threads;
    int n_vocab;

    llama_context * make_ctx() const {
        llama_context_params cp = llama_context_default_params();
        cp.n_ctx           = N_CTX;
        cp.n_batch         = N_CTX;
        cp.n_ubatch        = N_CTX;
        cp.n_seq_max       = 1;
        cp.n_rs_seq        = N_RS_SEQ;
        cp.type_k          = GGML_TYPE_F32;
        cp.type_v          = GGML_TYPE_F32;
        cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
        cp.n_threads       = n_threads;
        cp.n_threads_batch = n_threads;
        cp.offload_kqv     = false;
        cp.no_perf         = true;
        llama_context * ctx = llama_init_from_model(model, cp);
        if (!ctx) {
            die("failed to create context");
        }
        if (llama_n_rs_seq(ctx) != N_RS_SEQ) {
            die("n_rs_seq was not applied (model does not support recurrent rollback?)");
        }
        return ctx;
    }

    // decode tokens at positions pos0.., returning logits of all rows (all_rows) or the last row
    std::vector<Logits> decode(llama_context * ctx, const std::vector<llama_token> & toks, int pos0,
                               bool all_rows) const {
        const int n = (int) toks.size();
        llama_batch b = llama_batch_init(n, 0, 1);
        for (int i = 0; i < n; ++i) {
            b.token[i]     = toks[i];
            b.pos[i]       = pos0 + i;
            b.n_seq_id[i]  = 1;
            b.seq_id[i][0] = 0;
            b.logits[i]    = (all_rows || i == n - 1) ? 1 : 0;
        }
        b.n_tokens = n;
        const int rc = llama_decode(ctx, b);
        llama_batch_free(b);
        if (rc != 0) {
            fprintf(stderr, "dump_logits: llama_decode returned %d (n %d, pos0 %d)\n", rc, n, pos0);
            exit(1);
        }
        std::vector<Logits> out;
        for (int i = all_rows ? 0 : n - 1; i < n; ++i) {
            const float * l = llama_get_logits_ith(ctx, i);
            if (!l) {
                die("llama_get_logits_ith returned null");
            }
            Logits v(l, l + n_vocab);
            for (float x : v) {
                if (!std::isfinite(x)) {
                    die("non-finite logit");
                }
            }
            out.push_back(std::move(v));
        }
        return out;
    }

    Logits decode_one(llama_context * ctx, llama_token t, int pos) const {
        return decode(ctx, { t }, pos, false)[0];
    }

    // logits of the last token of `seq` decoded from scratch in a fresh context
    Logits fresh_last(const std::vector<llama_token> & seq) const {
        llama_context * ctx = make_ctx();
        Logits l = decode(ctx, seq, 0, false)[0];
        llama_free(ctx);
        return l;
    }
};

void seq_rm(llama_context * ctx, int p0) {
    if (!llama_memory_seq_rm(llama_get_memory(ctx), 0, p0, -1)) {
        fprintf(stderr, "dump_logits: llama_memory_seq_rm(seq 0, p0 %d, -1) returned false\n", p0);
        exit(1);
    }
    if (llama_memory_seq_pos_max(llama_get_memory(ctx), 0) != p0 - 1) {
        fprintf(stderr, "dump_logits: after seq_rm(%d) seq_pos_max is %d\n", p0,
                (int) llama_memory_seq_pos_max(llama_get_memory(ctx), 0));
        exit(1);
    }
}

double rel_diff(const Logits & a, const Logits & ref) {
    double dmax = 0.0, rmax = 0.0;
    for (size_t i = 0; i < a.size(); ++i) {
        dmax = std::fmax(dmax, std::fabs((double) a[i] - (double) ref[i]));
        rmax = std::fmax(rmax, std::fabs((double) ref[i]));
    }
    return dmax / std::fmax(rmax, 1e-30);
}

// ---- JSON output ----
struct Json {
    FILE * f;
    void num(float x) const { fprintf(f, "%.9g", (double) x); }
    void ids(const std::vector<llama_token> & v) const {
        fputc('[', f);
        for (size_t i = 0; i < v.size(); ++i) {
            fprintf(f, i ? ",%d" : "%d", (int) v[i]);
        }
        fputc(']', f);
    }
    void row(const Logits & v) const {
        fputc('[', f);
        for (size_t i = 0; i < v.size(); ++i) {
            if (i) {
                fputc(',', f);
            }
            num(v[i]);
        }
        fputc(']', f);
    }
    void rows(const std::vector<Logits> & v) const {
        fputs("[\n", f);
        for (size_t i = 0; i < v.size(); ++i) {
            fputs(i ? ",\n" : "", f);
            row(v[i]);
        }
        fputs("\n]", f);
    }
};

struct Trial {
    std::vector<llama_token> batch;
    int keep;
    std::vector<Logits> batch_logits;
    llama_token next;
    Logits logits;
};

}  // namespace

int main(int argc, char ** argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL.gguf OUT.json [--threads N] [--strict] [--lenient] [--verbose]\n", argv[0]);
        return 2;
    }
    const char * model_path = argv[1];
    const char * out_path   = argv[2];
    int  n_threads = 2;
    bool lenient   = false;
    bool strict    = false;
    for (int i = 3; i < argc; ++i) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            n_threads = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--verbose")) {
            g_verbose = true;
        } else if (!strcmp(argv[i], "--strict")) {
            strict = true;
        } else if (!strcmp(argv[i], "--lenient")) {
            lenient = true;
        } else {
            fprintf(stderr, "unknown argument: %s\n", argv[i]);
            return 2;
        }
    }
    if (n_threads < 1) {
        die("--threads must be >= 1");
    }

    llama_log_set(log_cb, nullptr);
    llama_backend_init();

    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    llama_model * model = llama_model_load_from_file(model_path, mp);
    if (!model) {
        die("failed to load %s", model_path);
    }
    char arch[64] = {0};
    llama_model_meta_val_str(model, "general.architecture", arch, sizeof(arch));
    if (strcmp(arch, "qwen35") != 0) {
        fprintf(stderr, "dump_logits: warning: architecture is '%s', not qwen35\n", arch);
    }

    Runner R{ model, n_threads, llama_vocab_n_tokens(llama_model_get_vocab(model)) };
    const int V = R.n_vocab;
    Lcg lcg(LCG_SEED);

    llama_context * ctx = R.make_ctx();

    // (a, b) prefill
    std::vector<llama_token> prompt(N_PROMPT);
    for (auto & t : prompt) {
        t = lcg.next(V);
    }
    std::vector<Logits> prefill = R.decode(ctx, prompt, 0, true);
    std::vector<llama_token> hist = prompt;  // all tokens in the sequence so far

    // (c) single-token decodes
    std::vector<llama_token> dec_tok;
    std::vector<Logits> dec_log;
    for (int i = 0; i < N_DECODE; ++i) {
        const llama_token t = lcg.next(V);
        dec_log.push_back(R.decode_one(ctx, t, (int) hist.size()));
        dec_tok.push_back(t);
        hist.push_back(t);
    }
    const int L = (int) hist.size();

    // A context in the state after (c), rebuilt by replaying (b) and (c) with the same calls.
    // The replay is bit-identical to the original (checked on the last decode step's logits).
    auto ctx_at_L = [&]() {
        llama_context * c = R.make_ctx();
        R.decode(c, prompt, 0, true);
        Logits last;
        for (int i = 0; i < N_DECODE; ++i) {
            last = R.decode_one(c, dec_tok[i], N_PROMPT + i);
        }
        if (memcmp(last.data(), dec_log.back().data(), sizeof(float) * V) != 0) {
            fprintf(stderr, "dump_logits: warning: replay to L is not bit-identical\n");
        }
        return c;
    };

    // Informational: llama.cpp rollback results that were replaced by a replay (non-strict mode)
    struct Info {
        std::string name;
        Logits      rollback_path;
        const Logits * recorded;
    };
    std::vector<Info> infos;

    // (d) rollback trials
    std::vector<Trial> trials;
    for (int keep = 0; keep <= N_KEEP_MAX; ++keep) {
        Trial tr;
        tr.keep = keep;
        for (int i = 0; i < N_BATCH_RB; ++i) {
            tr.batch.push_back(lcg.next(V));
        }
        tr.next = lcg.next(V);
        if (strict) {
            // literal protocol: one context, seq_rm back to L between trials
            tr.batch_logits = R.decode(ctx, tr.batch, L, true);
            seq_rm(ctx, L + keep);
            tr.logits = R.decode_one(ctx, tr.next, L + keep);
            seq_rm(ctx, L);
        } else {
            llama_context * c = ctx_at_L();
            tr.batch_logits = R.decode(c, tr.batch, L, true);
            seq_rm(c, L + keep);
            Logits rb = R.decode_one(c, tr.next, L + keep);
            llama_free(c);
            if (keep >= 1) {
                tr.logits = std::move(rb);  // rollback strictly inside the last batch: valid
            } else {
                // rolling back a whole batch restores a stale recurrent snapshot in 34af94cd
                c = ctx_at_L();
                tr.logits = R.decode_one(c, tr.next, L);
                llama_free(c);
                infos.push_back({ "rollback keep=0", std::move(rb), nullptr });
            }
        }
        trials.push_back(std::move(tr));
    }

    // (e) rollback after single-token steps
    std::vector<llama_token> ss_steps;
    for (int i = 0; i < N_STEPS_SS; ++i) {
        ss_steps.push_back(lcg.next(V));
    }
    const llama_token ss_next = lcg.next(V);
    Logits ss_logits;
    {
        llama_context * c = strict ? ctx : ctx_at_L();
        for (int i = 0; i < N_STEPS_SS; ++i) {
            R.decode_one(c, ss_steps[i], L + i);
        }
        seq_rm(c, L + KEEP_SS);
        Logits rb = R.decode_one(c, ss_next, L + KEEP_SS);
        if (strict) {
            ss_logits = std::move(rb);
        } else {
            llama_free(c);
            // a rollback after single-token decodes restores a stale snapshot in 34af94cd: replay
            c = ctx_at_L();
            for (int i = 0; i < KEEP_SS; ++i) {
                R.decode_one(c, ss_steps[i], L + i);
            }
            ss_logits = R.decode_one(c, ss_next, L + KEEP_SS);
            llama_free(c);
            infos.push_back({ "single_step_rollback", std::move(rb), nullptr });
        }
    }
    llama_free(ctx);
    if (!infos.empty()) {
        infos[0].recorded = &trials[0].logits;
        infos.back().recorded = &ss_logits;
    }

    // (f) self-check against fresh contexts
    bool ok = true;
    auto report = [&](const char * name, double d, bool required) {
        const bool bad = !(d <= TOL);
        fprintf(stderr, "self-check %-30s max rel diff vs fresh context: %.3e%s%s\n", name, d,
                required ? " (required)" : "", bad ? "  <-- FAIL" : "");
        if (bad && (required || !lenient)) {
            ok = false;
        }
    };
    auto check = [&](const char * name, const std::vector<llama_token> & kept, llama_token next,
                     const Logits & got, bool required) {
        std::vector<llama_token> seq = hist;
        seq.insert(seq.end(), kept.begin(), kept.end());
        seq.push_back(next);
        report(name, rel_diff(got, R.fresh_last(seq)), required);
    };
    {
        std::vector<llama_token> seq = prompt;
        double worst = 0.0;
        for (int i = 0; i < N_DECODE; ++i) {
            seq.push_back(dec_tok[i]);
            worst = std::fmax(worst, rel_diff(dec_log[i], R.fresh_last(seq)));
        }
        report("decode steps", worst, false);
    }
    for (const Trial & tr : trials) {
        // batch rows: all rows of hist + batch decoded afresh in one batch
        llama_context * c = R.make_ctx();
        std::vector<llama_token> seq = hist;
        seq.insert(seq.end(), tr.batch.begin(), tr.batch.end());
        const std::vector<Logits> rows = R.decode(c, seq, 0, true);
        llama_free(c);
        double worst = 0.0;
        for (int i = 0; i < N_BATCH_RB; ++i) {
            worst = std::fmax(worst, rel_diff(tr.batch_logits[i], rows[L + i]));
        }
        char name[64];
        snprintf(name, sizeof(name), "rollback keep=%d batch rows", tr.keep);
        report(name, worst, false);
        snprintf(name, sizeof(name), "rollback keep=%d next", tr.keep);
        check(name, std::vector<llama_token>(tr.batch.begin(), tr.batch.begin() + tr.keep), tr.next, tr.logits,
              tr.keep == 2);
    }
    check("single_step_rollback next", std::vector<llama_token>(ss_steps.begin(), ss_steps.begin() + KEEP_SS),
          ss_next, ss_logits, true);
    for (const Info & in : infos) {
        const double d = rel_diff(in.rollback_path, *in.recorded);
        fprintf(stderr, "info: %s via llama.cpp seq_rm: rel diff %.3e vs recorded (replayed) logits%s\n",
                in.name.c_str(), d,
                d <= TOL ? " -- llama.cpp now gets this right; --strict should pass" :
                           " (stale snapshot, llama.cpp 34af94cd defect; replay recorded instead)");
    }

    // JSON (to OUT.json.failed when the self-check failed, so that no bad fixture is left behind)
    const std::string path = ok ? std::string(out_path) : std::string(out_path) + ".failed";
    FILE * f = fopen(path.c_str(), "w");
    if (!f) {
        die("cannot open %s", path.c_str());
    }
    Json J{ f };
    fprintf(f, "{\"n_vocab\": %d,\n\"prompt\": ", V);
    J.ids(prompt);
    fputs(",\n\"prefill\": ", f);
    J.rows(prefill);
    fputs(",\n\"decode\": [", f);
    for (int i = 0; i < N_DECODE; ++i) {
        fprintf(f, "%s\n{\"token\": %d, \"logits\": ", i ? "," : "", (int) dec_tok[i]);
        J.row(dec_log[i]);
        fputc('}', f);
    }
    fputs("\n],\n\"rollback\": [", f);
    for (size_t i = 0; i < trials.size(); ++i) {
        const Trial & tr = trials[i];
        fprintf(f, "%s\n{\"batch\": ", i ? "," : "");
        J.ids(tr.batch);
        fprintf(f, ", \"keep\": %d, \"batch_logits\": ", tr.keep);
        J.rows(tr.batch_logits);
        fprintf(f, ", \"next\": %d, \"logits\": ", (int) tr.next);
        J.row(tr.logits);
        fputc('}', f);
    }
    fputs("\n],\n\"single_step_rollback\": {\"steps\": ", f);
    J.ids(ss_steps);
    fprintf(f, ", \"keep\": %d, \"next\": %d, \"logits\": ", KEEP_SS, (int) ss_next);
    J.row(ss_logits);
    fputs("}\n}\n", f);
    if (fclose(f) != 0) {
        die("write failed: %s", path.c_str());
    }

    llama_model_free(model);
    llama_backend_free();

    if (!ok) {
        fprintf(stderr, "dump_logits: SELF-CHECK FAILED (tolerance %.0e); wrote %s for inspection only\n", TOL,
                path.c_str());
        return 1;
    }
    fprintf(stderr, "dump_logits: wrote %s (n_vocab %d, L %d)\n", out_path, V, L);
    return 0;
}
