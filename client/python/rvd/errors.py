"""The one exception type of the client: an error rvd (or gRPC) reported."""
import grpc

# Codes that mean "rvd could not be reached or did not answer in time", not
# "rvd refused the request": a monitor with on_error="warn" reconnects.
UNREACHABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE,
                               grpc.StatusCode.DEADLINE_EXCEEDED})


class RvdError(Exception):
    """A call to rvd failed.

    code: the grpc.StatusCode rvd (or the gRPC runtime) answered with;
    code_name: its name, e.g. "INVALID_ARGUMENT"; details: the message.
    """

    def __init__(self, code, details, method=""):
        self.code = code
        self.code_name = code.name if code is not None else "UNKNOWN"
        self.details = details or ""
        self.method = method
        where = f" ({method})" if method else ""
        super().__init__(f"rvd{where}: {self.code_name}: {self.details}")

    @property
    def unreachable(self):
        """True when rvd was down, restarting or too slow, not refusing."""
        return self.code in UNREACHABLE_CODES

    @classmethod
    def from_rpc(cls, error, method=""):
        code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
        details = error.details() if hasattr(error, "details") else str(error)
        return cls(code, details, method)


class TransportUnavailable(NotImplementedError):
    """The transport asked for cannot be used with these weights or this
    rvd (RVMonitor(transport="ipc")); the message says why."""
