"""Sphinx configuration of the arrayrnn documentation site.

Build from the repository root (warnings are errors)::

    python -m sphinx -W --keep-going -b html docs docs/_build/html

Tools: ``pip install -e ".[docs]"`` (Sphinx, pydata-sphinx-theme, myst-parser, sphinx-gallery and the optional
packages the documented modules and the gallery import). No network is used: intersphinx is off.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # the gallery runs headless

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))  # document the working tree, installed or not

import arrayrnn  # noqa: E402

# ``ar.ops`` is an attribute of the package (``from .autodiff import ops``), not an importable submodule; let
# autodoc import it under the name users spell, so its entries are ``arrayrnn.ops.<name>``.
sys.modules.setdefault("arrayrnn.ops", arrayrnn.ops)

# -- Project information --
project = "arrayrnn"
author = "the arrayrnn developers"
copyright = "the arrayrnn developers"  # noqa: A001
release = arrayrnn.__version__
version = ".".join(release.split(".")[:2])

# -- General configuration --
extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "**.ipynb_checkpoints", "auto_examples/*.ipynb",
                    "auto_examples/*.py", "auto_examples/*.zip", "auto_examples/*.json",
                    "auto_examples/*.md5"]
templates_path = ["_templates"]
default_role = "py:obj"  # `name` in a docstring links to the API entry when there is one (silent otherwise)
add_module_names = False
toc_object_entries = False

# -- MyST (the guide pages are Markdown) --
myst_enable_extensions = ["colon_fence", "deflist", "dollarmath", "fieldlist"]
myst_heading_anchors = 3

# -- autodoc / autosummary / napoleon --
autosummary_generate = True
autosummary_generate_overwrite = True
autosummary_imported_members = False
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_preserve_defaults = True  # `xp=np`, not the repr of the numpy module
autodoc_typehints = "none"  # signatures as written; the docstrings' Parameters sections carry the types
autodoc_inherit_docstrings = False  # torch.nn subclasses: do not pull PyTorch's docstrings in as ours
autoclass_content = "class"
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_ivar = True  # "Attributes" sections as fields: no duplicate entries next to autodoc's
napoleon_use_rtype = False
napoleon_preprocess_types = False

# No intersphinx: CI builds have no network and the build must not depend on the internet.

# -- HTML --
html_theme = "pydata_sphinx_theme"
html_title = f"arrayrnn {release}"
html_static_path: list[str] = []
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
    "footer_start": ["copyright"],
    "footer_end": [],
}
html_show_sourcelink = False

# -- sphinx-gallery (examples/ -> auto_examples/, every script executed) --
EXAMPLES = ROOT / "examples"
if any((EXAMPLES / name).is_file() for name in ("README.rst", "README.txt")):
    extensions.append("sphinx_gallery.gen_gallery")
    sphinx_gallery_conf = {
        "examples_dirs": os.path.relpath(EXAMPLES, DOCS),
        "gallery_dirs": "auto_examples",
        "filename_pattern": r"/.*\.py",  # execute every example, not only plot_*.py
        "within_subsection_order": "FileNameSortKey",
        "abort_on_example_error": True,
        "image_scrapers": ("matplotlib",),
        "matplotlib_animations": False,
        "download_all_examples": False,
        "remove_config_comments": True,
        "plot_gallery": "True",
        "show_memory": False,
        "reference_url": {"arrayrnn": None},  # link names in the examples to the API pages (no network)
    }
else:  # no examples/README yet: build without the gallery
    exclude_patterns.append("auto_examples")
