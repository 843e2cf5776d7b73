"""Code lines of each kernel style and of the core, by file and by role.

A code line is a line holding a Python token other than a comment, a docstring or
layout (blank lines, indentation): counted with `tokenize`.

A line's role is that of the innermost function, method or class around it that has
one, else the role of its file's name, else `other` (imports, constants, kernel entry
bodies that only dispatch roles, barriers). A definition has a role when

- a comment `# role: <name>` (a name of ROLE_NAMES) sits in the comment block directly
  above it (above its decorators) or on its `def` / `class` line: the explicit marker,
  which wins; or
- it is a function or method whose name matches ROLES (first match wins).

The comment block directly above a definition belongs to it. `attribute` gives every
line's role; `count_file`, the `lines` report and the side-by-side page
(harness/sidebyside.py) all read it.
"""
from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROLE_NAMES = ("schedule", "load", "compute", "correction", "reduce_dq", "store", "combine", "host",
              "other")
ROLES = [  # (role, regex on the lower-cased function name), first match wins
    ("reduce_dq", r"reduce_dq|dq_reduce|dqaccum|dq_accum|reduce|postprocess"),
    ("host", r"^__init__$|^__call__$|^_?forward$|^_?backward$|^_?fwd$|^_?bwd$|launch|host|"
             r"compile|jagged_attention|available|config|setup|^_?make|check|validate|"
             r"can_implement|args|num_sms|sm_count|desc$|dtype|signature|smem|layout|"
             r"storage|tiled_mma|mlir|underlying|^create$"),
    ("schedule", r"schedul|tile|persistent|work|grid|order"),
    ("load", r"load|(^|_)tma|producer|prefetch|gather"),
    ("store", r"store|epilogue|write|save"),
    ("correction", r"correction"),
    ("combine", r"combine"),
    ("compute", r"compute|mma|gemm|softmax|attend|qk|pv|mask|rescale|correct|preprocess|"
                r"prob|visible|exp|scale|score|(^|_)d[spqkv](_|$)|dkdv|dq|row|kv_end|step|"
                r"overlap|finalize"),
]
MARKER = re.compile(r"#\s*role:\s*([A-Za-z_]\w*)")
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


def _tokens(src: str) -> list:
    return list(tokenize.generate_tokens(io.StringIO(src).readline))


def code_lines(src: str, toks=None) -> set[int]:
    """Line numbers holding code (no blanks, comments or docstrings)."""
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENCODING, tokenize.ENDMARKER}
    lines: set[int] = set()
    toks = _tokens(src) if toks is None else toks
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


@dataclass(frozen=True)
class FileRoles:
    """One file's lines (1-based: `text[n - 1]` is line n), each line's role and the
    lines holding code."""
    path: Path
    text: list[str]
    owner: dict[int, str]
    code: frozenset[int]

    def counts(self) -> dict[str, int]:
        """{role: code lines} over ROLE_NAMES, plus 'total'."""
        c = dict.fromkeys(ROLE_NAMES, 0)
        for ln in self.code:
            c[self.owner[ln]] += 1
        c["total"] = len(self.code)
        return c


def _markers(path: Path, toks) -> tuple[dict[int, str], set[int]]:
    """({line: role} of the `# role:` comments, the lines holding only a comment)."""
    marks, comment_only, last_line_code = {}, set(), {}
    for t in toks:
        if t.type == tokenize.COMMENT:
            m = MARKER.search(t.string)
            if m:
                if m.group(1) not in ROLE_NAMES:
                    raise ValueError(f"{path}:{t.start[0]}: unknown role {m.group(1)!r} "
                                     f"(roles: {', '.join(ROLE_NAMES)})")
                marks[t.start[0]] = m.group(1)
            if not last_line_code.get(t.start[0]):
                comment_only.add(t.start[0])
        elif t.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                            tokenize.ENCODING, tokenize.ENDMARKER):
            for ln in range(t.start[0], t.end[0] + 1):
                last_line_code[ln] = True
    return marks, comment_only


def _spans(tree, marks: dict[int, str], comment_only: set[int]):
    """(first, last, role) of every definition that has a role, outer before inner. A
    definition's span starts at the comment block directly above its decorators."""
    out = []
    for node in ast.walk(tree):  # breadth first: outer definitions come first
        func = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        if not func and not isinstance(node, ast.ClassDef):
            continue
        first = min([d.lineno for d in node.decorator_list] + [node.lineno])
        while first - 1 in comment_only:
            first -= 1
        marked = [marks[ln] for ln in range(first, node.lineno + 1) if ln in marks]
        role = marked[-1] if marked else role_of(node.name) if func else "other"
        if marked or role != "other":
            out.append((first, node.end_lineno, role))
    return out


def attribute(path) -> FileRoles:
    """Every line's role in one file (see the module's docstring)."""
    path = Path(path)
    src = path.read_text()
    toks = _tokens(src)
    text = src.splitlines()
    owner = dict.fromkeys(range(1, len(text) + 2), role_of(path.stem))
    marks, comment_only = _markers(path, toks)
    for a, b, role in _spans(ast.parse(src), marks, comment_only):
        owner.update(dict.fromkeys(range(a, b + 1), role))
    return FileRoles(path, text, owner, frozenset(code_lines(src, toks)))


def count_file(path) -> dict[str, int]:
    """{role: code lines} for one file, plus 'total'."""
    return attribute(path).counts()


def _fa4_dir() -> Path | None:
    """flash-attn-4's `flash_attn/cute` folder, found without importing it."""
    import importlib.util
    try:
        spec = importlib.util.find_spec("flash_attn")
    except (ImportError, ValueError):
        return None
    for loc in (spec.submodule_search_locations or []) if spec else []:
        if (Path(loc) / "cute").is_dir():
            return Path(loc) / "cute"
    return None


def styles(repo: Path = REPO) -> dict[str, tuple[Path, list[str]]]:
    """style -> (folder, files): the two kernel styles, the core (without the portable
    kernel), the portable kernel and FA4's Hopper path. Missing folders still appear
    (reported as missing)."""
    own = lambda d: sorted(p.name for p in d.glob("*.py")) if d.is_dir() else []
    core = repo / "jagged"
    fa4 = _fa4_dir()
    return {"tlx": (repo / "kernels_tlx", own(repo / "kernels_tlx")),
            "cute": (repo / "kernels_cute", own(repo / "kernels_cute")),
            "core": (core, [f for f in own(core) if f != "portable.py"]),
            "portable": (core, ["portable.py"] if (core / "portable.py").is_file() else []),
            "fa4-sm90": (fa4 or Path("flash_attn/cute"), FA4_SM90 if fa4 else [])}


def count_all(repo: Path = REPO) -> tuple[list[dict], list[str]]:
    """Rows {style, file, role counts..., total}, and the files that were missing."""
    rows, missing = [], []
    for style, (folder, files) in styles(repo).items():
        if not files:
            missing.append(f"{style}: no files in {folder}" if folder.is_dir() else
                           f"{style}: {folder} not found")
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
            "Role: an explicit `# role: <name>` comment above a definition, else the name of "
            "the innermost function or method holding the line (harness/lines.py ROLES), else "
            "the file name, else `other` (imports, constants, kernel entry bodies, barriers). "
            "`tlx`: kernels_tlx/, `cute`: kernels_cute/; `core`: jagged/ without the portable "
            "kernel (the API, validation, dispatch, tile lists, sequence ranges: what both "
            "styles share, counted in neither); `portable`: jagged/portable.py. FA4 files "
            "counted: " + ", ".join(FA4_SM90) + " (whole files; interface.py and quack's "
            "helpers not counted). The two styles role by role: "
            "[side_by_side.html](side_by_side.html)."]
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
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(names) + 2.4))
    left = [0] * len(names)
    for i, role in enumerate(ROLE_NAMES):
        vals = [stylesum[n][role] for n in names]
        ax.barh(names, vals, left=left, label=role, color=f"C{i}")
        left = [a + b for a, b in zip(left, vals)]
    ax.invert_yaxis()
    ax.set_xlabel("code lines (no blanks, comments, docstrings)")
    # below the axes: a longest bar (FA4's) reaches the right edge, where it would sit
    ax.legend(ncol=len(ROLE_NAMES) // 2 + 1, fontsize=8, loc="upper center",
              bbox_to_anchor=(0.5, -0.16), frameon=False)
    ax.grid(True, axis="x", alpha=0.35)
    ax.set_title("Code by role")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def write_lines(out_dir) -> list[Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows, missing = count_all()
    md = out_dir / "lines.md"
    md.write_text("# Code lines by role\n\n" + markdown(rows, missing))
    return [md, chart(rows, out_dir / "lines.png")]
