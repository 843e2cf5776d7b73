"""Code lines of each kernel style, by file and by role.

A code line is a line holding a Python token other than a comment, a docstring or
layout (blank lines, indentation): counted with `tokenize`. Each line's role comes
from the name of the innermost function or method around it that has a role
(ROLES, first match wins), else from the file's name, else `other` (imports,
constants, kernel entry bodies that only dispatch roles, barriers).
"""
from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROLE_NAMES = ("schedule", "load", "compute", "reduce_dq", "store", "host", "other")
ROLES = [  # (role, regex on the lower-cased function name), first match wins
    ("reduce_dq", r"reduce_dq|dq_reduce|dqaccum|dq_accum|reduce|postprocess"),
    ("host", r"^__init__$|^__call__$|^_?forward$|^_?backward$|^_?fwd$|^_?bwd$|launch|host|"
             r"compile|jagged_attention|available|config|setup|^_?make|check|validate|"
             r"can_implement|args|num_sms|sm_count|desc$|dtype|signature|smem|layout|"
             r"storage|tiled_mma|mlir|underlying|^create$"),
    ("schedule", r"schedul|tile|persistent|work|grid|order"),
    ("load", r"load|(^|_)tma|producer|prefetch|gather"),
    ("store", r"store|epilogue|write|save"),
    ("compute", r"compute|mma|gemm|softmax|attend|qk|pv|mask|rescale|correct|preprocess|"
                r"prob|visible|exp|scale|score|(^|_)d[spqkv](_|$)|dkdv|dq|row|kv_end|step|"
                r"overlap|finalize"),
]
# FA4's Hopper path: the two kernels and the modules they build on (whole files;
# the shared ones also serve other architectures). interface.py (host code for every
# architecture) and quack's helpers are not counted.
FA4_SM90 = ["flash_fwd_sm90.py", "flash_bwd_sm90.py", "flash_fwd.py", "flash_bwd_preprocess.py",
            "flash_bwd_postprocess.py", "tile_scheduler.py", "softmax.py", "mask.py",
            "block_info.py", "seqlen_info.py", "pipeline.py", "named_barrier.py", "barrier.py"]


def role_of(name: str) -> str:
    n = name.lower()
    for role, pat in ROLES:
        if re.search(pat, n):
            return role
    return "other"


def code_lines(src: str) -> set[int]:
    """Line numbers holding code (no blanks, comments or docstrings)."""
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENCODING, tokenize.ENDMARKER}
    lines: set[int] = set()
    toks = list(tokenize.generate_tokens(io.StringIO(src).readline))
    prev = tokenize.NEWLINE  # kind of the previous significant token
    for i, t in enumerate(toks):
        if t.type in skip:
            if t.type in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
                prev = tokenize.NEWLINE
            continue
        nxt = next((u for u in toks[i + 1:] if u.type not in (tokenize.COMMENT, tokenize.NL)), None)
        docstring = (t.type == tokenize.STRING and prev == tokenize.NEWLINE
                     and nxt is not None and nxt.type in (tokenize.NEWLINE, tokenize.ENDMARKER))
        if not docstring:
            lines.update(range(t.start[0], t.end[0] + 1))
        prev = t.type
    return lines


def _spans(tree) -> list[tuple[int, int, str]]:
    """(first, last, name) of every function or method, outer before inner; a
    function's decorators belong to it."""
    out = []
    for node in ast.walk(tree):  # breadth first: outer functions come first
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([d.lineno for d in node.decorator_list] + [node.lineno])
            out.append((first, node.end_lineno, node.name))
    return out


def count_file(path) -> dict[str, int]:
    """{role: code lines} for one file, plus 'total'. A line takes the role of the
    innermost function around it whose name has one, else the file name's role
    (e.g. tile_scheduler.py: schedule), else `other`."""
    path = Path(path)
    src = path.read_text()
    owner = dict.fromkeys(range(1, src.count("\n") + 2), role_of(path.stem))
    for a, b, name in _spans(ast.parse(src)):
        role = role_of(name)
        if role != "other":
            owner.update(dict.fromkeys(range(a, b + 1), role))
    counts = dict.fromkeys(ROLE_NAMES, 0)
    lines = code_lines(src)
    for ln in lines:
        counts[owner.get(ln, "other")] += 1
    counts["total"] = len(lines)
    return counts


def styles() -> dict[str, tuple[Path, list[str]]]:
    """style -> (folder, files). Missing folders still appear (reported as missing)."""
    tlx = REPO / "kernels_tlx"
    own = lambda d: sorted(p.name for p in d.glob("*.py")
                           if not p.name.startswith(("gpu_check", "test", "_gpu")))
    tlx_files = [f for f in own(tlx) if f != "portable.py"] if tlx.is_dir() else []
    cute = REPO / "kernels_cute"
    try:
        import importlib.util
        spec = importlib.util.find_spec("flash_attn.cute")
        fa4 = Path(spec.origin).parent if spec and spec.origin else None
    except Exception:
        fa4 = None
    return {"tlx": (tlx, tlx_files),
            "triton-portable": (tlx, ["portable.py"]),
            "cute": (cute, own(cute) if cute.is_dir() else []),
            "fa4-sm90": (fa4 or Path("flash_attn/cute (not installed)"), FA4_SM90)}


def count_all() -> tuple[list[dict], list[str]]:
    """Rows {style, file, role counts..., total}, and the files that were missing."""
    rows, missing = [], []
    for style, (folder, files) in styles().items():
        if not files:
            missing.append(f"{style}: no files in {folder}")
        for f in files:
            p = folder / f
            if not p.is_file():
                missing.append(f"{style}: {p}")
                continue
            try:
                rows.append({"style": style, "file": f, **count_file(p)})
            except (SyntaxError, tokenize.TokenError, UnicodeDecodeError) as e:
                missing.append(f"{style}: {p} ({type(e).__name__})")
    return rows, missing


def _shared_lines() -> int:
    return len(code_lines((Path(__file__).parent / "tiles.py").read_text()))


def markdown(rows, missing) -> str:
    head = ["style", "file", *ROLE_NAMES, "total"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    by_style: dict[str, dict] = {}
    for r in rows:
        out.append("| " + " | ".join(str(r[c]) for c in head) + " |")
        s = by_style.setdefault(r["style"], dict.fromkeys(ROLE_NAMES + ("total",), 0))
        for c in ROLE_NAMES + ("total",):
            s[c] += r[c]
    out += ["", "By style (sum of its files):", "",
            "| style | " + " | ".join(ROLE_NAMES) + " | total |",
            "|" + "---|" * (len(ROLE_NAMES) + 2)]
    out += ["| " + " | ".join([st] + [str(s[c]) for c in ROLE_NAMES + ("total",)]) + " |"
            for st, s in by_style.items()]
    out += ["", "Code lines: no blank lines, comments or docstrings (Python `tokenize`). "
            "Role: from the name of the innermost function or method holding the line "
            "(harness/lines.py ROLES), else the file name, else `other` (imports, "
            "constants, kernel entry bodies, barriers). FA4 files counted: "
            + ", ".join(FA4_SM90) + " (whole files; interface.py and quack's helpers not counted). "
            "Counted in neither of our styles: the code both share, `harness/tiles.py` "
            f"(the tile-list key kernels, {_shared_lines()} lines)."]
    if missing:
        out += ["", "Missing: " + "; ".join(missing)]
    return "\n".join(out) + "\n"


def chart(rows, path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    stylesum: dict[str, dict] = {}
    for r in rows:
        s = stylesum.setdefault(r["style"], dict.fromkeys(ROLE_NAMES, 0))
        for c in ROLE_NAMES:
            s[c] += r[c]
    names = list(stylesum)
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(names) + 1.8))
    left = [0] * len(names)
    for i, role in enumerate(ROLE_NAMES):
        vals = [stylesum[n][role] for n in names]
        ax.barh(names, vals, left=left, label=role, color=f"C{i}")
        left = [a + b for a, b in zip(left, vals)]
    ax.invert_yaxis()
    ax.set_xlabel("code lines (no blanks, comments, docstrings)")
    ax.legend(ncol=4, fontsize=8, loc="lower right")
    ax.grid(True, axis="x", alpha=0.35)
    ax.set_title("Kernel code by role")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def write_lines(out_dir) -> list[Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows, missing = count_all()
    md = out_dir / "lines.md"
    md.write_text("# Kernel code lines by role\n\n" + markdown(rows, missing))
    return [md, chart(rows, out_dir / "lines.png")]
