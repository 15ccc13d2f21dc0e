"""The base of the package's owners of C objects: a context manager whose
exit is close(). On its own, so every module can import it first."""


class Closing:
    """A context manager whose exit is close() (the package's owners of C
    objects: contexts, stores, connections, graphs, buffers)."""

    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
