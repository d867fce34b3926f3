"""A tiny self-contained HTML holder shared by token strips, banners and board views."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, repr=False)
class HTMLView:
    """Rendered HTML (inline CSS, no external scripts or fonts): shows itself in Jupyter and in exports.

    `.html` is the fragment; `.save(path)` writes a standalone page (UTF-8) for sharing or a browser.
    """

    html: str

    def _repr_html_(self) -> str:
        return self.html

    def __html__(self) -> str:  # markupsafe/jinja protocol: embeds unescaped in templates
        return self.html

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self.html)} chars of HTML)"

    def page(self, title: str = "rookworld_debug") -> str:
        import html as _html
        return ('<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
                f"<title>{_html.escape(title)}</title></head>\n<body>\n{self.html}\n</body></html>\n")

    def save(self, path: str | Path, title: str = "rookworld_debug") -> Path:
        path = Path(path)
        path.write_text(self.page(title), encoding="utf-8")
        return path
