"""How fmha talks to each array framework: export an array to the compiled core (DLPack), allocate
results and workspace with the caller's framework, find the stream to run on, and wrap results.

One adapter per framework; `adapter_for(array)` picks it from the array's type without importing
any framework the caller has not imported already.
"""

from __future__ import annotations

import sys

from . import _C

# DLPack's stream value for CUDA's legacy default stream (0 is reserved by the protocol).
_DLPACK_LEGACY_STREAM = 1


class NumpyAdapter:
    """NumPy arrays (CPU). bfloat16 works through ml_dtypes: its arrays pass as raw 16-bit words."""

    name = "numpy"
    on_cuda = False

    def __init__(self, array):
        import numpy

        self.np = numpy
        self.raw_bf16 = False

    def export(self, array):
        # ml_dtypes' bfloat16 is a NumPy 'V' (void-kind) dtype; float16/float32 are 'f'.
        if type(array) is self.np.ndarray and array.dtype.kind == "V" and array.dtype.name == "bfloat16":
            self.raw_bf16 = True
            return array.view(self.np.uint16)
        return array

    def empty(self, like, shape):
        return self.np.empty(shape, dtype=like.dtype)

    def empty_f32(self, like, shape):
        return self.np.empty(shape, dtype=self.np.float32)

    def workspace(self, like, nbytes):
        return self.np.empty((nbytes,), dtype=self.np.uint8)

    def stream(self, like, stream):
        if stream is not None:
            _stream_handle(stream)  # checked, then unused: CPU calls run on the calling thread
        return 0

    def finish(self, stream):
        pass

    def wrap(self, array):
        return array


class TorchAdapter:
    """PyTorch tensors on CPU or CUDA. Tensors are exported with torch's C-level to_dlpack, which
    neither synchronizes nor touches any stream, and fmha runs on torch's current stream."""

    name = "torch"

    def __init__(self, array):
        import torch

        self.torch = torch
        self.on_cuda = array.device.type == "cuda"
        self.raw_bf16 = False
        self._to_dlpack = torch._C._to_dlpack
        self._explicit_stream = None  # a torch stream for stream=, so allocations follow it

    def export(self, array):
        if array.requires_grad:
            array = array.detach()
        return self._to_dlpack(array)

    def _empty(self, shape, dtype, device):
        if self._explicit_stream is None:
            return self.torch.empty(shape, dtype=dtype, device=device)
        # Allocate on the stream that writes the result, as the caching allocator expects.
        with self.torch.cuda.stream(self._explicit_stream):
            return self.torch.empty(shape, dtype=dtype, device=device)

    def empty(self, like, shape):
        return self._empty(shape, like.dtype, like.device)

    def empty_f32(self, like, shape):
        return self._empty(shape, self.torch.float32, like.device)

    def workspace(self, like, nbytes):
        return self._empty((nbytes,), self.torch.uint8, like.device)

    def stream(self, like, stream):
        if stream is None:
            return current_torch_stream(self.torch, like.device.index) if self.on_cuda else 0
        handle = _stream_handle(stream)
        if self.on_cuda:
            cuda = self.torch.cuda
            self._explicit_stream = stream if isinstance(stream, cuda.Stream) else cuda.ExternalStream(
                handle, device=like.device)
            return handle
        return 0

    def finish(self, stream):
        pass

    def wrap(self, array):
        return array


def current_torch_stream(torch, device_index):
    """The raw cudaStream_t of torch's current stream on `device_index` (capture-aware)."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw(device_index)
    return torch.cuda.current_stream(device_index).cuda_stream


class CupyAdapter:
    """CuPy arrays (CUDA). fmha runs on CuPy's current stream; arrays are exported with that
    stream so CuPy orders any pending work on it (the DLPack stream contract)."""

    name = "cupy"
    on_cuda = True

    def __init__(self, array):
        import cupy

        self.cupy = cupy
        self.raw_bf16 = False
        self._stream = None
        self._explicit_stream = None  # a CuPy stream for stream=, so allocations follow it

    def export(self, array):
        stream = self._stream if self._stream else _DLPACK_LEGACY_STREAM
        return array.__dlpack__(stream=stream)

    def _empty(self, like, shape, dtype):
        with like.device:
            if self._explicit_stream is None:
                return self.cupy.empty(shape, dtype=dtype)
            # Allocate on the stream that writes the result (CuPy's pool is stream-ordered).
            with self._explicit_stream:
                return self.cupy.empty(shape, dtype=dtype)

    def empty(self, like, shape):
        return self._empty(like, shape, like.dtype)

    def empty_f32(self, like, shape):
        return self._empty(like, shape, self.cupy.float32)

    def workspace(self, like, nbytes):
        return self._empty(like, (nbytes,), self.cupy.uint8)

    def stream(self, like, stream):
        if stream is not None:
            self._stream = _stream_handle(stream)
            cuda = self.cupy.cuda
            self._explicit_stream = stream if isinstance(stream, cuda.Stream) else cuda.ExternalStream(self._stream)
        else:
            with like.device:
                self._stream = self.cupy.cuda.get_current_stream().ptr
        return self._stream

    def finish(self, stream):
        pass

    def wrap(self, array):
        return array


class JaxAdapter:
    """JAX arrays (CPU or CUDA). JAX arrays are immutable and JAX does not expose its streams, so:
    inputs are waited for (block_until_ready); results are computed into fresh buffers — NumPy
    arrays on the CPU, device buffers from fmha's own cudaMalloc on a GPU — and handed to JAX
    through DLPack (jax.dlpack.from_dlpack: no copy where JAX accepts the buffer as is); the call
    runs on the CUDA legacy default stream (or `stream=`) and is synchronized before returning."""

    name = "jax"

    def __init__(self, array):
        import jax
        import jax.dlpack
        import numpy

        self.jax = jax
        self.np = numpy
        device = next(iter(array.devices()))
        self.on_cuda = device.platform == "gpu"
        self.device = device
        self.raw_bf16 = False
        if self.on_cuda and not hasattr(_C, "cuda_empty"):
            raise RuntimeError("q: JAX array on a GPU, but this fmha build has no CUDA support")

    def export(self, array):
        if isinstance(array, self.jax.Array):
            array.block_until_ready()
            if self.on_cuda:
                return array.__dlpack__()
            # A host view of the CPU buffer, no copy.
            array = self.np.asarray(array)
        if isinstance(array, self.np.ndarray) and array.dtype.kind == "V" and array.dtype.name == "bfloat16":
            self.raw_bf16 = True
            return array.view(self.np.uint16)
        return array

    def _alloc(self, shape, dtype_name):
        if self.on_cuda:
            return _C.cuda_empty(list(shape), dtype_name, self.device.id)
        if dtype_name == "bfloat16":
            import ml_dtypes

            return self.np.empty(shape, dtype=ml_dtypes.bfloat16)
        return self.np.empty(shape, dtype=dtype_name)

    def empty(self, like, shape):
        return self._alloc(shape, str(like.dtype))

    def empty_f32(self, like, shape):
        return self._alloc(shape, "float32")

    def workspace(self, like, nbytes):
        return self._alloc((nbytes,), "uint8")

    def stream(self, like, stream):
        return _stream_handle(stream) if stream is not None else 0

    def finish(self, stream):
        if self.on_cuda:
            _C.synchronize(stream)

    def wrap(self, array):
        if isinstance(array, self.jax.Array):
            return array
        if self.np is not None and isinstance(array, self.np.ndarray):
            return self.jax.device_put(array, self.device)
        return self.jax.dlpack.from_dlpack(array)


class DLPackAdapter(NumpyAdapter):
    """Any other object with __dlpack__ (CPU only: fmha cannot allocate in an unknown framework's
    device memory). Results come back as NumPy arrays, allocated as NumpyAdapter does."""

    name = "dlpack"

    def __init__(self, array):
        super().__init__(array)
        device_type, _ = array.__dlpack_device__()
        if device_type not in (1, 3):  # kDLCPU, kDLCUDAHost
            raise TypeError(
                "q: arrays of type %s on a device are supported only from NumPy, PyTorch, CuPy or JAX"
                % type(array).__name__
            )
        self.dtype = self.np.from_dlpack(array).dtype

    def export(self, array):
        return array

    def empty(self, like, shape):
        return self.np.empty(shape, dtype=self.dtype)


def _stream_handle(stream):
    """A cudaStream_t as an int, from an int or a framework stream object."""
    if isinstance(stream, int):
        return stream
    for attribute in ("cuda_stream", "ptr", "handle"):
        value = getattr(stream, attribute, None)
        if isinstance(value, int):
            return value
    cuda_stream = getattr(stream, "__cuda_stream__", None)
    if cuda_stream is not None:
        return int(cuda_stream()[1])
    raise TypeError("stream: expected an int (cudaStream_t) or a PyTorch/CuPy stream, got %s" % type(stream).__name__)


def adapter_for(array):
    module = type(array).__module__.split(".", 1)[0]
    if module == "numpy":
        return NumpyAdapter(array)
    if module == "torch" and "torch" in sys.modules:
        return TorchAdapter(array)
    if module == "cupy" and "cupy" in sys.modules:
        return CupyAdapter(array)
    if module in ("jax", "jaxlib") and "jax" in sys.modules:
        return JaxAdapter(array)
    if hasattr(array, "__dlpack__") and hasattr(array, "__dlpack_device__"):
        return DLPackAdapter(array)
    raise TypeError(
        "q: expected an array (NumPy, PyTorch, CuPy, JAX or any DLPack object), got %s" % type(array).__name__
    )
