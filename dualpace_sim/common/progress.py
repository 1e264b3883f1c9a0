"""Progress bars that draw on a terminal and stay out of logs.

tqdm redraws a bar with a carriage return several times a second; into a file or a CI log each
redraw is one more line fragment, hundreds per run. With ``disable=None`` tqdm draws only when
its stream is a terminal, which is what every bar of both programs wants.
"""

from __future__ import annotations

from tqdm import tqdm


def progress_bar(progress: bool, **kwargs) -> tqdm:
    """A tqdm bar, drawn only when ``progress`` is asked for and stderr is a terminal."""
    return tqdm(disable=None if progress else True, **kwargs)
