"""reports/side_by_side.html: the two kernel styles next to each other, role by role.

For every file name that both kernels_tlx/ and kernels_cute/ have (fwd_hopper,
bwd_hopper, schedule, tile_counter, ...) and for every role, the TLX lines in the left
column and the CuteDSL lines in the right one, each run of consecutive lines with its
line numbers, and the code lines of each side per role and in total. A line's role is
harness/lines.py's (`attribute`), so the counts are those of `python -m harness lines`.
The files only one style has follow, in one column. Static HTML with inline CSS,
highlighted with pygments when it is importable.

    python -m harness sidebyside [--out reports/side_by_side.html]
"""
from __future__ import annotations

import html
from pathlib import Path

from .lines import REPO, ROLE_NAMES, FileRoles, attribute

SIDES = (("tlx", "kernels_tlx", "Triton + TLX"), ("cute", "kernels_cute", "CuteDSL"))
FIRST = ("fwd_hopper", "bwd_hopper", "schedule", "tile_counter")  # the reading order

CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 1.5em; color: #1b1f24; }
h1 { font-size: 1.5em; } h2 { margin-top: 2.2em; border-bottom: 2px solid #d0d7de; }
h3 { margin: 1.6em 0 .4em; font-size: 1.1em; }
.n { font-weight: normal; color: #57606a; }
table { border-collapse: collapse; margin: .5em 0 1em; }
td, th { border: 1px solid #d0d7de; padding: 2px 8px; text-align: right; }
td:first-child, th:first-child { text-align: left; }
.cols { display: grid; grid-template-columns: 1fr 1fr; gap: 10px; align-items: start; }
.cols.one { grid-template-columns: 1fr; }
.col { min-width: 0; border: 1px solid #d0d7de; border-radius: 4px; }
.col .head { background: #f6f8fa; padding: 3px 8px; font-weight: 600;
             border-bottom: 1px solid #d0d7de; }
pre { margin: 0; padding: 4px 0; overflow-x: auto; font: 12px/1.4 ui-monospace, monospace; }
pre .run { display: block; color: #57606a; background: #f6f8fa; padding: 1px 8px;
           border-top: 1px dashed #d0d7de; }
pre .ln { display: inline-block; width: 4.5em; padding-right: .8em; text-align: right;
          color: #8c959f; user-select: none; }
.none { padding: 6px 8px; color: #8c959f; font-style: italic; }
"""


def pairs(repo: Path = REPO) -> list[tuple[str, Path | None, Path | None]]:
    """(file stem, TLX path or None, CuteDSL path or None): the common names first (FIRST,
    then the others, the package face `__init__` last), then the files of one style."""
    files = [{p.stem: p for p in (repo / d).glob("*.py")} if (repo / d).is_dir() else {}
             for _, d, _ in SIDES]
    common = set(files[0]) & set(files[1])
    order = ([n for n in FIRST if n in common]
             + sorted(n for n in common if n not in FIRST and n != "__init__")
             + (["__init__"] if "__init__" in common else []))
    only = sorted(set(files[0]) ^ set(files[1]))
    return [(n, files[0].get(n), files[1].get(n)) for n in order + only]


def _highlighter():
    """(lines of a file -> its lines as HTML, CSS) with pygments, else escaped text."""
    try:
        from pygments import highlight
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import PythonLexer
    except ImportError:
        return (lambda text: [html.escape(t) for t in text]), ""
    fmt = HtmlFormatter(nowrap=True)
    lexer = PythonLexer(stripnl=False, ensurenl=True)

    def render(text):
        # the formatter closes and reopens its spans at every line end, so the lines
        # split apart stay well formed
        out = highlight("\n".join(text) + "\n", lexer, fmt).split("\n")
        return out[:len(text)]
    return render, fmt.get_style_defs("pre")


def runs(fr: FileRoles, role: str) -> list[tuple[int, int]]:
    """(first, last) line of each maximal run of lines of `role`, blank lines at either
    end left out; runs of blank lines dropped."""
    out, n = [], len(fr.text)
    ln = 1
    while ln <= n:
        if fr.owner[ln] != role:
            ln += 1
            continue
        a = ln
        while ln <= n and fr.owner[ln] == role:
            ln += 1
        b = ln - 1
        while a <= b and not fr.text[a - 1].strip():
            a += 1
        while b >= a and not fr.text[b - 1].strip():
            b -= 1
        if a <= b:
            out.append((a, b))
    return out


def _count(fr: FileRoles | None, role: str) -> int | None:
    return None if fr is None else sum(fr.owner[ln] == role for ln in fr.code)


def _cell(n) -> str:
    return "–" if n is None else str(n)


def _column(fr: FileRoles | None, rendered, label: str, role: str, folder: str,
            repo: Path) -> str:
    if fr is None:
        return (f'<div class="col"><div class="head">{label}</div>'
                f'<div class="none">no such file in {folder}/</div></div>')
    rel = fr.path.relative_to(repo) if fr.path.is_relative_to(repo) else fr.path
    head = f'<div class="head">{label}: {html.escape(str(rel))}</div>'
    rs = runs(fr, role)
    if not rs:
        return f'<div class="col">{head}<div class="none">no lines of this role</div></div>'
    body = []
    for a, b in rs:
        body.append(f'<span class="run">lines {a}–{b}</span>')
        body += [f'<span class="ln">{ln}</span>{rendered[ln - 1]}' for ln in range(a, b + 1)]
    return f'<div class="col">{head}<pre>' + "\n".join(body) + "</pre></div>"


def page(repo: Path = REPO) -> str:
    """The whole page."""
    render, pyg_css = _highlighter()
    sections, toc = [], []
    grand = {s: 0 for s, _, _ in SIDES}
    for name, *paths in pairs(repo):
        frs = [attribute(p) if p else None for p in paths]
        rendered = [render(fr.text) if fr else None for fr in frs]
        both = all(frs)
        fname = f"{name}.py"
        roles = [r for r in ROLE_NAMES if any(fr and runs(fr, r) for fr in frs)]
        totals = [None if fr is None else len(fr.code) for fr in frs]
        for (s, _, _), t in zip(SIDES, totals):
            grand[s] += t or 0
        attrs = lambda s, r: f'data-style="{s}" data-file="{fname}" data-role="{r}"'
        rows = []
        for r in roles + ["total"]:
            cells = [_count(fr, r) if r != "total" else t for fr, t in zip(frs, totals)]
            link = f'<a href="#{name}-{r}">{r}</a>' if r != "total" else "total"
            rows.append(f"<tr><td>{link}</td>" + "".join(
                f'<td class="n" {attrs(s, r)}>{_cell(c)}</td>'
                for (s, _, _), c in zip(SIDES, cells)) + "</tr>")
        head = "<tr><th>role</th>" + "".join(f"<th>{lab}</th>" for _, _, lab in SIDES) + "</tr>"
        body = [f'<h2 id="{name}">{fname}</h2>', f"<table>{head}{''.join(rows)}</table>"]
        for r in roles:
            counts = " · ".join(f"{lab} {_cell(_count(fr, r))}"
                                for (_, _, lab), fr in zip(SIDES, frs) if fr)
            cols = "".join(_column(fr, rd, lab, r, folder, repo)
                           for (_, folder, lab), fr, rd in zip(SIDES, frs, rendered)
                           if fr or both)
            body += [f'<div class="role" id="{name}-{r}"><h3>{r} '
                     f'<span class="n">({counts} code lines)</span></h3>',
                     f'<div class="cols{"" if both else " one"}">{cols}</div></div>']
        sections.append("\n".join(body))
        kind = "" if both else f" (only {' / '.join(lab for (_, _, lab), fr in zip(SIDES, frs) if fr)})"
        toc.append(f'<li><a href="#{name}">{fname}</a>{kind}: ' + ", ".join(
            f'<a href="#{name}-{r}">{r}</a>' for r in roles) + ' <span class="n">('
            + " / ".join(_cell(t) for t, fr in zip(totals, frs) if fr) + ")</span></li>")
    total = " · ".join(f"{lab} {grand[s]}" for s, _, lab in SIDES)
    intro = ("Each file of the two kernel styles, role by role: Triton + TLX (kernels_tlx/) "
             "on the left, CuteDSL (kernels_cute/) on the right. Counts are code lines (no "
             "blank lines, comments or docstrings); a line's role is that of the innermost "
             "definition around it with a role (a <code># role: &lt;name&gt;</code> comment "
             "above it, else its name), else its file's, else <code>other</code>, as "
             "<a href=\"lines.md\">lines.md</a> counts them (harness/lines.py). The core both "
             "styles import (jagged/) is counted there, not here.")
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        "<title>Jagged attention: TLX and CuteDSL side by side</title>",
        f"<style>{CSS}{pyg_css}</style></head><body>",
        "<h1>Jagged attention: Triton + TLX and CuteDSL side by side</h1>",
        f"<p>{intro}</p>", f'<p class="n">Code lines in all: {total}.</p>',
        '<nav class="toc"><h2 id="contents">Contents</h2><ul>', *toc,
        f'</ul><p class="n">(code lines: {" / ".join(lab for _, _, lab in SIDES)})</p></nav>',
        *sections, "</body></html>", ""])


def write_side_by_side(path=None, repo: Path = REPO) -> Path:
    path = Path(path) if path else repo / "reports" / "side_by_side.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page(repo))
    return path
