"""HTML: an executed notebook → one self-contained offline report page; the error page of a failed run."""
from __future__ import annotations

import html
import re
from collections.abc import Mapping
from dataclasses import dataclass

from rookworld_debug.report.grid import _fmt_value


_OFFLINE_TEMPLATE = """{%- extends 'index.html.j2' -%}
{%- block html_head_js_requirejs -%}{%- endblock html_head_js_requirejs -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{% block jupyter_widgets %}{% endblock jupyter_widgets %}
"""
_EXTERNAL_SCRIPT_RE = re.compile(
    r"<script\b[^>]*?\bsrc\s*=\s*[\"']?(?:https?:)?//[^\"'\s>]+[\"']?[^>]*>\s*</script>", re.IGNORECASE)
_ANY_EXTERNAL_SRC_RE = re.compile(r"<(?:script|link)\b[^>]*?\b(?:src|href)\s*=\s*[\"']?(?:https?:)?//",
                                  re.IGNORECASE)
_PLOTLYJS_RE = re.compile(r"plotly\.js v\d+\.\d+")
_PLOTLY_MIME = "application/vnd.plotly.v1+json"


@dataclass(frozen=True)
class HtmlCheck:
    """What :func:`export_html` verified about the HTML it produced."""

    bytes: int
    plotly_figures: int            # figure outputs in the notebook
    plotly_js_inline: bool         # the plotly.js bundle is embedded in the page
    converted_figures: int         # JSON-only figures the exporter had to render itself
    removed_external_scripts: int  # <script src=http...> tags stripped (e.g. plotly's MathJax CDN tag)
    external_refs: int             # <script|link src|href=http...> left (must be 0)
    math_formulas: int = 0         # LaTeX formulas converted to MathML

    @property
    def offline_ok(self) -> bool:
        return self.external_refs == 0 and (self.plotly_figures == 0 or self.plotly_js_inline)

    def warnings(self) -> list[str]:
        out = []
        if self.converted_figures:
            out.append(f"{self.converted_figures} plotly figure(s) carried only the JSON mimetype and were "
                       "rendered by the exporter; set plotly.io.renderers.default = "
                       "'plotly_mimetype+notebook' in the notebook")
        if self.plotly_figures and not self.plotly_js_inline:
            out.append("plotly figures present but plotly.js is not embedded: they will not render offline")
        if self.external_refs:
            out.append(f"{self.external_refs} external <script>/<link> reference(s) left in the HTML")
        return out


def _fill_plotly_html(nb) -> tuple[int, int]:
    """Give JSON-only plotly outputs a text/html rendering (plotly.js included once, before first use).
    Returns (figures, converted)."""
    figures = converted = 0
    have_bundle = False
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data") or {}
            html_text = data.get("text/html", "")
            if isinstance(html_text, list):
                html_text = "".join(html_text)
            if html_text and _PLOTLYJS_RE.search(html_text[:2000]):
                have_bundle = True
            if _PLOTLY_MIME not in data:
                continue
            figures += 1
            if html_text:
                continue
            import plotly.io as pio
            fig = data[_PLOTLY_MIME]
            data["text/html"] = pio.to_html(fig, include_plotlyjs=not have_bundle, full_html=False,
                                            include_mathjax=False, validate=False)
            have_bundle = True
            converted += 1
    return figures, converted


# Math: LaTeX → MathML at export time (latex2mathml, pure Python). Chromium ≥ 109, Firefox and Safari render
# MathML Core natively, so the page needs no script, no font files and no network; bundling KaTeX instead
# would add ~300 kB of JS + fonts to every report and only render when scripts run.
_CODE_RE = re.compile(r"(```.*?```|~~~.*?~~~|`[^`\n]*`)", re.S)
_DISPLAY_RE = re.compile(r"\$\$(.+?)\$\$", re.S)
_INLINE_RE = re.compile(r"(?<![\\$\w])\$(?=\S)([^$\n]+?)(?<=\S)\$(?![\w$])")


def latex_to_mathml(tex: str, *, display: bool) -> str:
    """One formula → MathML; a formula latex2mathml cannot parse stays visible as code, flagged."""
    from latex2mathml.converter import convert
    try:
        return convert(tex.strip(), display="block" if display else "inline")
    except Exception:  # noqa: BLE001 - keep the page; show the source instead of a broken formula
        return f"<code class='rw-math-error' title='formula not rendered'>{html.escape(tex.strip())}</code>"


def markdown_math_to_mathml(text: str) -> tuple[str, int]:
    """Replace $$…$$ and $…$ outside code spans/blocks by MathML. Returns (text, formulas converted)."""
    n = 0

    def one(seg: str) -> str:
        nonlocal n
        def disp(m):
            nonlocal n
            n += 1
            return "\n\n<div class='rw-math' style='overflow-x:auto'>" + latex_to_mathml(m.group(1), display=True) + "</div>\n\n"

        def inl(m):
            nonlocal n
            n += 1
            return latex_to_mathml(m.group(1), display=False)
        return _INLINE_RE.sub(inl, _DISPLAY_RE.sub(disp, seg))

    parts = _CODE_RE.split(text)
    return "".join(p if i % 2 else one(p) for i, p in enumerate(parts)), n


def _render_math(nb) -> int:
    """Markdown cells and text/markdown outputs: LaTeX → MathML in place. Returns formulas converted."""
    total = 0
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source, k = markdown_math_to_mathml(cell.source)
            total += k
        for out in cell.get("outputs", []):
            md = (out.get("data") or {}).get("text/markdown")
            if md:
                md = "".join(md) if isinstance(md, list) else md
                out["data"]["text/markdown"], k = markdown_math_to_mathml(md)
                total += k
    return total


def export_html(notebook, *, banner: str | None = None) -> tuple[str, HtmlCheck]:
    """Executed notebook (path or NotebookNode) → self-contained HTML with code hidden: nbconvert's lab
    template without the require.js/MathJax/mermaid/widget CDN tags, plotly.js inline, any remaining
    ``<script src=http...>`` (plotly adds a MathJax CDN tag per figure) stripped. Markdown LaTeX ($$…$$,
    $…$) is converted to MathML (rendered natively, offline). ``banner`` (HTML) is put at the top."""
    import jinja2
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(str(notebook), as_version=4) if not hasattr(notebook, "cells") else notebook
    figures, converted = _fill_plotly_html(nb)
    formulas = _render_math(nb)
    exporter = HTMLExporter(template_name="lab", exclude_input=True, exclude_input_prompt=True,
                            exclude_output_prompt=True,
                            extra_loaders=[jinja2.DictLoader({"rookworld_offline.html.j2": _OFFLINE_TEMPLATE})],
                            template_file="rookworld_offline.html.j2")
    body, _ = exporter.from_notebook_node(nb)
    body, removed = _EXTERNAL_SCRIPT_RE.subn("", body)
    if banner:
        body = body.replace("<main>", "<main>\n" + banner, 1)
    check = HtmlCheck(bytes=len(body.encode("utf-8")), plotly_figures=figures,
                      plotly_js_inline=bool(_PLOTLYJS_RE.search(body)), converted_figures=converted,
                      removed_external_scripts=removed, external_refs=len(_ANY_EXTERNAL_SRC_RE.findall(body)),
                      math_formulas=formulas)
    return body, check


_PAGE_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:1.5rem 2rem;color:#1f2328}
h1{font-size:1.4rem;margin:0 0 .3rem} h2{font-size:1.1rem;margin:1.4rem 0 .4rem}
table{border-collapse:collapse;font-size:.85rem} th,td{border:1px solid #d0d7de;padding:.25rem .5rem;text-align:left}
th{background:#f6f8fa;cursor:pointer;position:sticky;top:0} td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.failed td{background:#ffebe9} tr.incomplete td,tr.pending td{background:#fff8c5}
.badge{display:inline-block;padding:0 .45rem;border-radius:.6rem;font-size:.78rem;font-weight:600}
.ok{background:#dafbe1;color:#116329} .failed{background:#ffebe9;color:#a40e26}
.incomplete,.pending{background:#fff8c5;color:#7d4e00} .flag{color:#a40e26;font-weight:600}
pre{background:#f6f8fa;border:1px solid #d0d7de;padding:.6rem;overflow:auto;font-size:.8rem;line-height:1.35}
.muted{color:#656d76;font-size:.85rem} code{background:#f6f8fa;padding:0 .2rem}
.scroll{overflow-x:auto;max-width:100%} table.runs th{white-space:normal;max-width:9em;word-break:break-word}
.ansi-red-fg{color:#c81e1e}.ansi-green-fg{color:#116329}.ansi-yellow-fg{color:#7d4e00}
.ansi-blue-fg{color:#0550ae}.ansi-cyan-fg{color:#1b7c83}.ansi-magenta-fg{color:#8250df}.ansi-bold{font-weight:700}
"""


def _ansi_html(text: str) -> str:
    try:
        from nbconvert.filters.ansi import ansi2html
        return ansi2html(text)
    except Exception:  # noqa: BLE001 - cosmetic only
        return html.escape(re.sub("\x1b\\[[0-9;]*[A-Za-z]", "", text))


def _strip_ansi(text: str) -> str:
    return re.sub("\x1b\\[[0-9;]*[A-Za-z]", "", text)


def error_page(*, run_id: str, params: Mapping, error: Mapping, sweep: str | None = None,
               notebook: str | None = None, links: Mapping[str, str] | None = None) -> str:
    """A standalone HTML page for a failed run: the failing cell (index, source) and its traceback."""
    esc = html.escape
    rows = "".join(f"<tr><th>{esc(str(k))}</th><td><code>{esc(_fmt_value(v))}</code></td></tr>"
                   for k, v in params.items())
    cell = ""
    if error.get("cell_index") is not None:
        count = error.get("exec_count")
        in_n = "" if count is None else f" (In [{esc(str(count))}])"
        cell = (f"<h2>Failing cell: index {esc(str(error['cell_index']))}{in_n}</h2>"
                f"<pre>{esc(error.get('cell_source') or '')}</pre>")
    tb = error.get("traceback") or []
    tb_text = "\n".join(tb) if isinstance(tb, list) else str(tb)
    link_html = " · ".join(f"<a href='{esc(href)}'>{esc(label)}</a>" for label, href in (links or {}).items())
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>FAILED {esc(run_id)}</title>
<style>{_PAGE_CSS}</style></head><body>
<h1>Run failed: <code>{esc(run_id)}</code> <span class="badge failed">failed</span></h1>
<p class="muted">sweep <code>{esc(sweep or '')}</code> · notebook <code>{esc(notebook or '')}</code>
{('· ' + link_html) if link_html else ''}</p>
<h2>{esc(str(error.get('ename', 'Error')))}: {esc(str(error.get('evalue', '')))}</h2>
{cell}
<h2>Traceback</h2>
<pre class="traceback">{_ansi_html(tb_text)}</pre>
<h2>Parameters</h2><table>{rows}</table>
</body></html>
"""
