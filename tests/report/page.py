"""Parse a rendered report page: elements, SVG titles, table captions and rows."""

from __future__ import annotations

from html.parser import HTMLParser


class Page(HTMLParser):
    """Collects elements by tag with their attributes, titles of SVGs and table captions/rows."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.svg_titles: list[str] = []
        self.captions: list[str] = []
        self.table_rows: dict[str, list[list[str]]] = {}
        self._stack: list[str] = []
        self._table: str | None = None
        self._row: list[str] | None = None
        self._text: list[str] = []
        self._cell: list[str] | None = None
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = {k: v or "" for k, v in attrs}
        self.elements.append((tag, attributes))
        self._stack.append(tag)
        if tag == "table":
            self._table = attributes.get("id", "")
            self.table_rows[self._table] = []
        elif tag == "tr" and self._table is not None:
            self._row = []
        elif tag in ("td", "th"):
            self._cell = []
        self._text = []

    def handle_endtag(self, tag: str) -> None:
        text = "".join(self._text).strip()
        if tag == "title" and "svg" in self._stack:
            self.svg_titles.append(text)
        elif tag == "caption":
            self.captions.append(text)
        elif tag in ("td", "th") and self._row is not None:
            self._row.append("".join(self._cell or ()).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None and self._table is not None:
            self.table_rows[self._table].append(self._row)
            self._row = None
        elif tag == "table":
            self._table = None
        while self._stack and self._stack.pop() != tag:
            pass
        self._text = []

    def handle_data(self, data: str) -> None:
        self._text.append(data)
        if self._cell is not None:
            self._cell.append(data)
        self.text.append(data)

    def all(self, tag: str, **attrs: str) -> list[dict[str, str]]:
        return [a for t, a in self.elements if t == tag and all(a.get(k) == v for k, v in attrs.items())]

    def rows(self, table_id: str) -> list[list[str]]:
        """Body rows of a table (the header row dropped)."""
        return self.table_rows[table_id][1:]


def parse(html: str) -> Page:
    page = Page()
    page.feed(html)
    return page
