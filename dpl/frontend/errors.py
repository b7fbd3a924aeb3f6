"""The frontends' error, in a module of its own: every frontend module raises it, and the
package (whose ``load_model`` imports the frontends) re-exports it."""

from dpl.errors import DplError


class FrontendError(DplError):
    """A model construct a frontend cannot bring in: the message names the operator or node,
    where it is in the model, and what dpl supports instead."""
