package bpf

import (
	"fmt"
	"strings"
)

// CudaFunc numbers a probed libcuda entry point: enum cuda_func in
// gpuarb.h, the uprobe's cookie.
type CudaFunc = gpuarbCudaFunc

// Class is what a libcuda entry point does, as far as metering goes.
type Class int

// Entry point classes. The metered ones (Metered reports which) must be
// probed in every variant a libcuda exports.
const (
	ClassLaunch      Class = iota + 1 // submits kernels: cuLaunchKernel, cuLaunchKernelEx, ...
	ClassGraphLaunch                  // submits a graph's kernels
	ClassEventRecord                  // marks how far a stream's work reaches
	ClassStreamWait                   // orders a stream after another's record
	ClassCapture                      // begins or ends a stream capture (launches build a graph, nothing runs)
	ClassSync                         // blocks until work completes
	ClassQuery                        // tells whether work completed (polled)
	ClassContext                      // creates a context on a GPU
	ClassContextEnd                   // ends a context
	ClassMemory                       // allocates or frees device memory
	ClassCopy                         // copies or sets memory on the copy engine
	ClassStreamOp                     // stream operations that use no GPU time (host functions, memory words)
	ClassSetup                        // everything else: devices, modules, streams, events, graphs, errors
)

var classNames = map[Class]string{
	ClassLaunch: "launch", ClassGraphLaunch: "graph launch", ClassEventRecord: "event record",
	ClassStreamWait: "stream wait", ClassCapture: "capture", ClassSync: "sync", ClassQuery: "completion query", ClassContext: "context",
	ClassContextEnd: "context end", ClassMemory: "memory", ClassCopy: "copy", ClassStreamOp: "stream operation",
	ClassSetup: "setup",
}

func (c Class) String() string {
	if n, ok := classNames[c]; ok {
		return n
	}
	return fmt.Sprintf("class %d", int(c))
}

// Metered tells whether gpuarb must see every call of the class.
func (c Class) Metered() bool { return c >= ClassLaunch && c <= ClassCopy }

// EntryPoint is one exported libcuda symbol gpuarb knows.
type EntryPoint struct {
	Symbol string
	Class  Class
	// Func is its number when gpuarb probes it (0: not probed).
	Func CudaFunc
	// PerThread marks the _ptsz and _ptds variants: a NULL stream is the
	// calling thread's default stream, not the legacy one.
	PerThread bool
	// On is what a sync or a completion query waits on.
	On WaitOn
	// Async marks a copy that returns before its work is done; Begins a
	// capture's start (its end otherwise); Frees a memory free (an
	// allocation otherwise).
	Async, Begins, Frees bool
	// Where arguments that move between variants are, 1-based (0: none):
	// a copy's byte count (shifted left by bytesShift) and stream, a
	// context's device. They travel in the uprobe cookie.
	bytesArg, streamArg, bytesShift, deviceArg uint8
}

// cookie is the uprobe cookie of a probed entry point (gpuarb.h COOKIE_*).
func (e EntryPoint) cookie() uint64 {
	c := uint64(e.Func)
	if e.Class == ClassContext {
		return c | uint64(e.deviceArg)<<16
	}
	return c | uint64(e.bytesArg)<<16 | uint64(e.streamArg)<<20 | uint64(e.bytesShift)<<24
}

// WaitOn is what a sync or a completion query waits on.
type WaitOn uint8

// What syncs and queries wait on: all the context's work, a stream's, or
// an event's record.
const (
	OnContext WaitOn = iota
	OnStream
	OnEvent
)

// with sets f on each entry point of es.
func with(es []EntryPoint, f func(*EntryPoint)) []EntryPoint {
	for i := range es {
		f(&es[i])
	}
	return es
}

func onStream(e *EntryPoint) { e.On = OnStream }
func onEvent(e *EntryPoint)  { e.On = OnEvent }
func begins(e *EntryPoint)   { e.Begins = true }
func frees(e *EntryPoint)    { e.Frees = true }

// copyEntry is a copy's entry point: plain, and its per-thread variant
// (suffix _ptds for synchronous calls, _ptsz for asynchronous ones).
func copyEntries(symbol string, plain, perThread CudaFunc, bytesArg, streamArg, shift uint8) []EntryPoint {
	suffix := "_ptds"
	if streamArg != 0 {
		suffix = "_ptsz"
	}
	e := EntryPoint{Symbol: symbol, Class: ClassCopy, Func: plain, bytesArg: bytesArg, streamArg: streamArg, bytesShift: shift,
		Async: streamArg != 0}
	p := e
	p.Symbol, p.Func, p.PerThread = symbol+suffix, perThread, true
	return []EntryPoint{e, p}
}

// pair is an entry point and its _ptsz variant.
func pair(symbol string, c Class, plain, perThread CudaFunc) []EntryPoint {
	return []EntryPoint{{Symbol: symbol, Class: c, Func: plain}, {Symbol: symbol + "_ptsz", Class: c, Func: perThread, PerThread: true}}
}

// EntryPoints are the libcuda symbols gpuarb knows, probed or not: every
// variant docs/driver.md §1 lists for the CUDA runtime, PyTorch, NCCL
// and Triton, and the rest of the driver API the simulated GPU exports.
var EntryPoints = func() []EntryPoint {
	var es []EntryPoint
	add := func(e ...EntryPoint) { es = append(es, e...) }
	add(pair("cuLaunchKernel", ClassLaunch, gpuarbCudaFuncCU_LAUNCH_KERNEL, gpuarbCudaFuncCU_LAUNCH_KERNEL_PTSZ)...)
	add(pair("cuLaunchKernelEx", ClassLaunch, gpuarbCudaFuncCU_LAUNCH_KERNEL_EX, gpuarbCudaFuncCU_LAUNCH_KERNEL_EX_PTSZ)...)
	add(pair("cuLaunchCooperativeKernel", ClassLaunch, gpuarbCudaFuncCU_LAUNCH_COOPERATIVE, gpuarbCudaFuncCU_LAUNCH_COOPERATIVE_PTSZ)...)
	add(pair("cuGraphLaunch", ClassGraphLaunch, gpuarbCudaFuncCU_GRAPH_LAUNCH, gpuarbCudaFuncCU_GRAPH_LAUNCH_PTSZ)...)
	add(pair("cuEventRecord", ClassEventRecord, gpuarbCudaFuncCU_EVENT_RECORD, gpuarbCudaFuncCU_EVENT_RECORD_PTSZ)...)
	add(pair("cuEventRecordWithFlags", ClassEventRecord, gpuarbCudaFuncCU_EVENT_RECORD_WITH_FLAGS, gpuarbCudaFuncCU_EVENT_RECORD_WITH_FLAGS_PTSZ)...)
	add(pair("cuStreamWaitEvent", ClassStreamWait, gpuarbCudaFuncCU_STREAM_WAIT_EVENT, gpuarbCudaFuncCU_STREAM_WAIT_EVENT_PTSZ)...)
	add(with(pair("cuStreamBeginCapture_v2", ClassCapture, gpuarbCudaFuncCU_STREAM_BEGIN_CAPTURE, gpuarbCudaFuncCU_STREAM_BEGIN_CAPTURE_PTSZ), begins)...)
	add(with(pair("cuStreamBeginCapture", ClassCapture, gpuarbCudaFuncCU_STREAM_BEGIN_CAPTURE_V1, gpuarbCudaFuncCU_STREAM_BEGIN_CAPTURE_V1PTSZ), begins)...)
	add(with(pair("cuStreamBeginCaptureToGraph", ClassCapture, gpuarbCudaFuncCU_STREAM_BEGIN_CAPTURE_TO_GRAPH, gpuarbCudaFuncCU_STREAM_BEGIN_CAPTURE_TO_GRAPH_PTSZ), begins)...)
	add(pair("cuStreamEndCapture", ClassCapture, gpuarbCudaFuncCU_STREAM_END_CAPTURE, gpuarbCudaFuncCU_STREAM_END_CAPTURE_PTSZ)...)
	add(with(pair("cuStreamSynchronize", ClassSync, gpuarbCudaFuncCU_STREAM_SYNC, gpuarbCudaFuncCU_STREAM_SYNC_PTSZ), onStream)...)
	add(EntryPoint{Symbol: "cuCtxSynchronize", Class: ClassSync, Func: gpuarbCudaFuncCU_CTX_SYNC},
		EntryPoint{Symbol: "cuCtxSynchronize_v2", Class: ClassSync, Func: gpuarbCudaFuncCU_CTX_SYNC_V2},
		EntryPoint{Symbol: "cuEventSynchronize", Class: ClassSync, Func: gpuarbCudaFuncCU_EVENT_SYNC, On: OnEvent},
		EntryPoint{Symbol: "cuEventQuery", Class: ClassQuery, Func: gpuarbCudaFuncCU_EVENT_QUERY, On: OnEvent})
	add(with(pair("cuStreamQuery", ClassQuery, gpuarbCudaFuncCU_STREAM_QUERY, gpuarbCudaFuncCU_STREAM_QUERY_PTSZ), onStream)...)
	add(EntryPoint{Symbol: "cuCtxCreate_v2", Class: ClassContext, Func: gpuarbCudaFuncCU_CTX_CREATE_V2, deviceArg: 3},
		EntryPoint{Symbol: "cuCtxCreate_v3", Class: ClassContext, Func: gpuarbCudaFuncCU_CTX_CREATE_V3, deviceArg: 5},
		EntryPoint{Symbol: "cuCtxCreate_v4", Class: ClassContext, Func: gpuarbCudaFuncCU_CTX_CREATE_V4, deviceArg: 4},
		EntryPoint{Symbol: "cuDevicePrimaryCtxRetain", Class: ClassContext, Func: gpuarbCudaFuncCU_PRIMARY_CTX_RETAIN, deviceArg: 2},
		EntryPoint{Symbol: "cuCtxDestroy_v2", Class: ClassContextEnd, Func: gpuarbCudaFuncCU_CTX_DESTROY},
		EntryPoint{Symbol: "cuDevicePrimaryCtxRelease", Class: ClassContextEnd, Func: gpuarbCudaFuncCU_PRIMARY_CTX_RELEASE},
		EntryPoint{Symbol: "cuDevicePrimaryCtxRelease_v2", Class: ClassContextEnd, Func: gpuarbCudaFuncCU_PRIMARY_CTX_RELEASE_V2},
		EntryPoint{Symbol: "cuDevicePrimaryCtxReset", Class: ClassContextEnd, Func: gpuarbCudaFuncCU_PRIMARY_CTX_RESET},
		EntryPoint{Symbol: "cuDevicePrimaryCtxReset_v2", Class: ClassContextEnd, Func: gpuarbCudaFuncCU_PRIMARY_CTX_RESET_V2},
		EntryPoint{Symbol: "cuMemAlloc_v2", Class: ClassMemory, Func: gpuarbCudaFuncCU_MEM_ALLOC},
		EntryPoint{Symbol: "cuMemFree_v2", Class: ClassMemory, Func: gpuarbCudaFuncCU_MEM_FREE, Frees: true})
	add(pair("cuMemAllocAsync", ClassMemory, gpuarbCudaFuncCU_MEM_ALLOC_ASYNC, gpuarbCudaFuncCU_MEM_ALLOC_ASYNC_PTSZ)...)
	add(with(pair("cuMemFreeAsync", ClassMemory, gpuarbCudaFuncCU_MEM_FREE_ASYNC, gpuarbCudaFuncCU_MEM_FREE_ASYNC_PTSZ), frees)...)
	add(copyEntries("cuMemcpyHtoD_v2", gpuarbCudaFuncCU_MEMCPY_HTOD, gpuarbCudaFuncCU_MEMCPY_HTOD_PTDS, 3, 0, 0)...)
	add(copyEntries("cuMemcpyDtoH_v2", gpuarbCudaFuncCU_MEMCPY_DTOH, gpuarbCudaFuncCU_MEMCPY_DTOH_PTDS, 3, 0, 0)...)
	add(copyEntries("cuMemcpyDtoD_v2", gpuarbCudaFuncCU_MEMCPY_DTOD, gpuarbCudaFuncCU_MEMCPY_DTOD_PTDS, 3, 0, 0)...)
	add(copyEntries("cuMemcpyHtoDAsync_v2", gpuarbCudaFuncCU_MEMCPY_HTOD_ASYNC, gpuarbCudaFuncCU_MEMCPY_HTOD_ASYNC_PTSZ, 3, 4, 0)...)
	add(copyEntries("cuMemcpyDtoHAsync_v2", gpuarbCudaFuncCU_MEMCPY_DTOH_ASYNC, gpuarbCudaFuncCU_MEMCPY_DTOH_ASYNC_PTSZ, 3, 4, 0)...)
	add(copyEntries("cuMemcpyDtoDAsync_v2", gpuarbCudaFuncCU_MEMCPY_DTOD_ASYNC, gpuarbCudaFuncCU_MEMCPY_DTOD_ASYNC_PTSZ, 3, 4, 0)...)
	add(copyEntries("cuMemcpy", gpuarbCudaFuncCU_MEMCPY, gpuarbCudaFuncCU_MEMCPY_PTDS, 3, 0, 0)...)
	add(copyEntries("cuMemcpyAsync", gpuarbCudaFuncCU_MEMCPY_ASYNC, gpuarbCudaFuncCU_MEMCPY_ASYNC_PTSZ, 3, 4, 0)...)
	add(copyEntries("cuMemcpyPeer", gpuarbCudaFuncCU_MEMCPY_PEER, gpuarbCudaFuncCU_MEMCPY_PEER_PTDS, 5, 0, 0)...)
	add(copyEntries("cuMemcpyPeerAsync", gpuarbCudaFuncCU_MEMCPY_PEER_ASYNC, gpuarbCudaFuncCU_MEMCPY_PEER_ASYNC_PTSZ, 5, 6, 0)...)
	add(copyEntries("cuMemsetD8_v2", gpuarbCudaFuncCU_MEMSET_D8, gpuarbCudaFuncCU_MEMSET_D8PTDS, 3, 0, 0)...)
	add(copyEntries("cuMemsetD8Async", gpuarbCudaFuncCU_MEMSET_D8ASYNC, gpuarbCudaFuncCU_MEMSET_D8ASYNC_PTSZ, 3, 4, 0)...)
	add(copyEntries("cuMemsetD32_v2", gpuarbCudaFuncCU_MEMSET_D32, gpuarbCudaFuncCU_MEMSET_D32PTDS, 3, 0, 2)...)
	add(copyEntries("cuMemsetD32Async", gpuarbCudaFuncCU_MEMSET_D32ASYNC, gpuarbCudaFuncCU_MEMSET_D32ASYNC_PTSZ, 3, 4, 2)...)
	for _, s := range []string{"cuLaunchHostFunc", "cuLaunchHostFunc_ptsz", "cuStreamWriteValue32", "cuStreamWaitValue32",
		"cuStreamWriteValue32_v2", "cuStreamWaitValue32_v2", "cuStreamWriteValue32_v2_ptsz", "cuStreamWaitValue32_v2_ptsz"} {
		add(EntryPoint{Symbol: s, Class: ClassStreamOp})
	}
	for _, s := range []string{"cuInit", "cuDriverGetVersion", "cuGetProcAddress", "cuGetProcAddress_v2", "cuGetErrorName",
		"cuGetErrorString", "cuDeviceGet", "cuDeviceGetCount", "cuDeviceGetName", "cuDeviceGetAttribute", "cuDeviceTotalMem_v2",
		"cuCtxSetCurrent", "cuCtxGetCurrent", "cuCtxPushCurrent_v2", "cuCtxPopCurrent_v2", "cuCtxGetDevice",
		"cuCtxGetStreamPriorityRange", "cuDevicePrimaryCtxSetFlags", "cuDevicePrimaryCtxSetFlags_v2", "cuDevicePrimaryCtxGetState",
		"cuModuleLoadData", "cuModuleGetFunction", "cuModuleUnload", "cuStreamCreate", "cuStreamCreateWithPriority",
		"cuStreamDestroy_v2", "cuStreamGetCtx", "cuStreamIsCapturing", "cuStreamIsCapturing_ptsz", "cuEventCreate", "cuEventDestroy_v2",
		"cuEventElapsedTime", "cuGraphCreate", "cuGraphInstantiateWithFlags", "cuGraphGetNodes", "cuGraphExecUpdate_v2", "cuGraphExecDestroy",
		"cuGraphDestroy", "cuMemGetInfo_v2", "cuIpcGetMemHandle", "cuIpcOpenMemHandle_v2", "cuIpcCloseMemHandle",
		// Pinned host memory: seen at the driver boundary (RM_ALLOC of NV01_MEMORY_SYSTEM).
		"cuMemHostAlloc", "cuMemAllocHost_v2", "cuMemFreeHost",
		// Managed memory: seen as the mmap of a nvidia-uvm file it makes.
		"cuMemAllocManaged"} {
		add(EntryPoint{Symbol: s, Class: ClassSetup})
	}
	return es
}()

// entryByFunc indexes the probed entry points by number.
var entryByFunc = func() map[CudaFunc]EntryPoint {
	m := map[CudaFunc]EntryPoint{}
	for _, e := range EntryPoints {
		if e.Func != 0 {
			m[e.Func] = e
		}
	}
	return m
}()

// EntryPointOf returns the probed entry point with number f.
func EntryPointOf(f uint32) (EntryPoint, bool) {
	e, ok := entryByFunc[CudaFunc(f)]
	return e, ok
}

// LibcudaExport is one exported function of a libcuda, as gpuarb sees it.
type LibcudaExport struct {
	Symbol  string `json:"symbol"`
	Class   string `json:"class"`   // "" for a cu* symbol gpuarb does not know
	Probed  bool   `json:"probed"`  // gpuarb attaches a uprobe to it
	Metered bool   `json:"metered"` // of a class gpuarb must see every call of
}

// LibcudaExports reads the functions a shared object exports and says for
// each cu* one what gpuarb makes of it. It reads the ELF only: nothing is
// loaded or run.
func LibcudaExports(path string) ([]LibcudaExport, error) {
	names, err := exportedFunctions(path)
	if err != nil {
		return nil, err
	}
	known := map[string]EntryPoint{}
	for _, e := range EntryPoints {
		known[e.Symbol] = e
	}
	var out []LibcudaExport
	for _, n := range names {
		if !strings.HasPrefix(n, "cu") {
			continue
		}
		x := LibcudaExport{Symbol: n}
		if e, ok := known[n]; ok {
			x.Class, x.Probed, x.Metered = e.Class.String(), e.Func != 0, e.Class.Metered()
		}
		out = append(out, x)
	}
	return out, nil
}

// exportedFunctions lists the functions whose names start with "cu" that
// the shared object at path (the operator's, or the host's linker
// cache's) exports, sorted: read as openRegular opens and readExports
// reads a tenant's file.
func exportedFunctions(path string) ([]string, error) {
	f, st, err := openLibcuda(path)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	defer f.Close()
	exports, err := readExports(f, st.Size)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	out := make([]string, len(exports))
	for i, e := range exports {
		out[i] = e.name
	}
	return out, nil
}
