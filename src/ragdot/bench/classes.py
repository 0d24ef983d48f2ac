"""The six ragged-dot classes, now defined in `ragdot.measure.classes`; this name stays for the bench's systems."""

from ragdot.measure.classes import *  # noqa: F403
from ragdot.measure.classes import __all__  # noqa: F401
