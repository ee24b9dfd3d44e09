"""A real notebook, run headless by a real Jupyter kernel: ``gpuscope.profile()`` and the ``%%gpuscope`` magic show
the report inline, with the verdict, and ``prof.summary()`` prints the terminal summary."""

from __future__ import annotations

import html
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOK = Path(__file__).resolve().parents[2] / "sample_workloads" / "profile_in_notebook.ipynb"


def cell_output(nb, source: str) -> list[dict]:
    (cell,) = [c for c in nb.cells if c.cell_type == "code" and c.source.splitlines()[0] == source]
    return cell.outputs


def test_the_sample_notebook_shows_the_report_inline_with_its_verdict(tmp_path: Path) -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=240, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises, with the cell's traceback, if any cell fails

    (shown,) = [o for o in cell_output(nb, "prof") if o.output_type == "execute_result"]
    inline = shown.data["text/html"]
    assert inline.startswith("<iframe srcdoc=") and "sandbox=" in inline
    assert "data-loading-bound" in html.unescape(inline)
    assert "more DataLoader workers" in html.unescape(inline) or "more-dataloader-workers" in html.unescape(inline)

    printed = "".join(o.get("text", "") for o in cell_output(nb, "prof.summary()"))
    assert "gpuscope: data-loading-bound" in printed and "report.html" in printed

    magic = [o for o in cell_output(nb, "%%gpuscope") if o.output_type == "display_data"]
    assert len(magic) == 1 and "data-loading-bound" in html.unescape(magic[0].data["text/html"])
    (bound,) = [o for o in cell_output(nb, "_gpuscope.verdict.bound") if o.output_type == "execute_result"]
    assert bound.data["text/plain"] == "'data-loading'"

    runs = sorted((tmp_path / "gpuscope-runs").iterdir())
    assert [r.name.split("-")[0] for r in runs] == ["notebook", "notebook"]  # the CLI's default folders
    assert all((r / "report.html").is_file() and (r / "run.json").is_file() for r in runs)
