"""The documentation stays navigable: every relative link in README.md,
docs/*.md and the examples' READMEs reaches an existing file (and, for a
link to a Markdown heading, that heading), and the README stays a short
entry point rather than growing back into the whole manual."""
import glob
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README_MAX_LINES = 320

# [text](target) and ![alt](target); the target ends at whitespace or ")".
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
_INLINE_CODE = re.compile(r"`[^`\n]*`")


def _pages():
  pages = [os.path.join(ROOT, "README.md"),
           os.path.join(ROOT, "examples", "README.md")]
  pages += sorted(glob.glob(os.path.join(ROOT, "examples", "*", "README.md")))
  pages += sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
  return pages


def _prose(text):
  """The text without code blocks and inline code, where links are not
  links."""
  return _INLINE_CODE.sub("", _FENCE.sub("", text))


def _anchors(path):
  """GitHub's anchors for the headings of a Markdown file: lower case,
  punctuation other than '-' and '_' dropped, spaces to '-', repeats
  numbered."""
  with open(path, encoding="utf-8") as f:
    text = _FENCE.sub("", f.read())
  seen = {}
  anchors = set()
  for heading in re.findall(r"^#{1,6}\s+(.*?)\s*#*\s*$", text, re.M):
    slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
    count = seen.get(slug, 0)
    seen[slug] = count + 1
    anchors.add(slug if count == 0 else "%s-%d" % (slug, count))
  return anchors


def _relative_links(path):
  with open(path, encoding="utf-8") as f:
    text = _prose(f.read())
  for target in _LINK.findall(text):
    if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, mailto:
      continue
    yield target


def _page_id(path):
  return os.path.relpath(path, ROOT)


def test_pages_exist():
  for name in ("README.md", "examples/README.md", "docs/architecture.md",
               "docs/benchmarks.md", "docs/config.md"):
    assert os.path.isfile(os.path.join(ROOT, name)), name


@pytest.mark.parametrize("page", _pages(), ids=_page_id)
def test_relative_links_point_at_existing_files(page):
  broken = []
  for target in _relative_links(page):
    file_part, _, anchor = target.partition("#")
    resolved = (os.path.normpath(os.path.join(os.path.dirname(page),
                                              file_part))
                if file_part else page)
    if not os.path.exists(resolved):
      broken.append("%s (no file %s)" % (target, _page_id(resolved)))
    elif anchor and resolved.endswith(".md") and os.path.isfile(resolved):
      if anchor not in _anchors(resolved):
        broken.append("%s (no heading #%s in %s)" % (
            target, anchor, _page_id(resolved)))
  assert not broken, "%s has broken links:\n  %s" % (
      _page_id(page), "\n  ".join(broken))


def test_readme_stays_short():
  with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
    lines = f.read().splitlines()
  assert len(lines) < README_MAX_LINES, (
      "README.md has %d lines; keep it under %d and move details into a "
      "page under docs/." % (len(lines), README_MAX_LINES))


def test_every_docs_page_is_reachable_from_the_readme():
  """A page nobody links to is a page nobody finds: each docs/*.md is
  linked from the README or from a page the README links to."""
  reached = set()
  todo = [os.path.join(ROOT, "README.md")]
  while todo:
    page = todo.pop()
    if page in reached:
      continue
    reached.add(page)
    for target in _relative_links(page):
      file_part = target.partition("#")[0]
      if file_part.endswith(".md"):
        linked = os.path.normpath(os.path.join(os.path.dirname(page),
                                               file_part))
        if os.path.isfile(linked):
          todo.append(linked)
  unreached = [_page_id(p) for p in glob.glob(os.path.join(ROOT, "docs",
                                                           "*.md"))
               if p not in reached]
  assert not unreached, "not linked from the README: %s" % unreached
