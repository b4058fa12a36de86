"""FlashAttention-4's hooks in the build, kept in this one place: FA4 and flash-attn 2.x share the
`flash_attn/` package, so installing a built FA2 wheel must not silently take FA4's files away.

- an --install-target folder that holds FA4 is refused before pip runs (pip --target replaces the whole
  flash_attn/ folder, FA4's cute/ with it);
- a locked environment whose lock pins FA4 gets FA4's wheel back after FA2's install (toolkit.fa4.install);
- a line with FA4 instead of FA2 builds no wheel: `toolkit build` says how FA4 is installed instead.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from toolkit.base.errors import ToolkitError
from toolkit.base.paths import display_path
from toolkit.base.workspace import Workspace
from toolkit.env.install_record import Fa4Record
from toolkit.env.lockfile import LockedEnv
from toolkit.spec.envspec import EnvSpec

FA4_WHEEL = "flash-attn-4"  # the lock's pip entry of FA4


def refuse_target_holding_fa4(target: Path) -> None:
    """pip --target would replace the folder's whole flash_attn/ package, FA4's included."""
    if (target / Fa4Record.FILE).is_file():
        raise ToolkitError(
            f"{display_path(target)}: holds flash-attn-4; pip --target would replace its whole "
            f"flash_attn/ package (install flash-attn 2.x into a fresh folder first, then "
            f"`toolkit fa4 install --target` that folder)"
        )


def restore_after_flash_attn_2(locked: LockedEnv) -> Callable[[str, Path], None] | None:
    """What gives FA4's files back after FA2's install into the lock's environment (python, log); None where
    the lock pins no FA4 wheel."""
    pin = next((p for p in locked.packages if p.manager == "pip" and p.name == FA4_WHEEL), None)
    if pin is None or not pin.url:
        return None
    url, sha256 = pin.url, pin.sha256

    def restore(python: str, log_path: Path) -> None:
        from toolkit.fa4.install import (
            restore_after_flash_attn_2 as reinstall,
        )  # the fa4 wing: only when needed

        reinstall(python, url, sha256, log_path)

    return restore


def nothing_to_build(spec: EnvSpec, workspace: Workspace) -> str:
    """Why a line builds no wheel: FA4 instead of FA2, which is pinned wheels, nothing to compile."""
    return (
        f"{spec.where('flash_attn_4.with_flash_attn_2')}: line {spec.line} builds no wheel "
        f"({spec.flash_attn_2_left_out()}: FlashAttention-4 instead of flash-attn 2.x); install "
        f"FA4 with `toolkit fa4 install --lock {display_path(workspace.fa4_lock_file(spec.line))}`"
    )
