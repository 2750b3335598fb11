"""A software prefetch for the kernels' random reads (docs/architecture.md, "Prefetching the gathered rows").

The products ``X_block^T V`` read a row of ``V`` at every nonzero, at the nonzero's row number: random reads,
which the hardware's prefetchers cannot foresee. Out of order, a core keeps a few of those misses in flight, as
many as its reorder window holds nonzeros; a kernel with more work a nonzero (two columns of V, a state update
each column) holds fewer and waits longer. :func:`prefetch_row` asks for the row a nonzero some distance ahead
will read, so its miss overlaps the nonzeros between: a hint only (the numbers are unchanged), which never faults
whatever the address.

Each kernel writes the guard ``if k + DISTANCE < nnz: prefetch_row(V, indices[k + DISTANCE])`` out in its loop: a
helper function taking the arrays, called a nonzero, made the products several times slower (numba counts the
references to the arrays it passes, at every call, even inlined: docs/measurements.md, "Prefetching").
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

# how many nonzeros ahead a kernel asks for the row it will read: about a miss's latency over the time a nonzero
# takes (docs/measurements.md, "Prefetching")
DISTANCE = 32


@intrinsic
def prefetch_row(typingctx, arr, i):
    """Hint that row ``i`` of the array ``arr`` (its first element: ``data + i * strides[0]``) is read soon
    (``llvm.prefetch``: a read, kept in every cache level). ``i`` need not be a valid row: no load is made."""
    if not isinstance(arr, types.Array) or not isinstance(i, types.Integer):
        return None
    sig = types.void(arr, i)

    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        byte = ir.IntType(8).as_pointer()
        i64 = ir.IntType(64)
        stride = builder.extract_value(ary.strides, 0)
        ity = signature.args[1]
        row = args[1]
        if ity.bitwidth < 64:
            row = builder.sext(row, i64) if ity.signed else builder.zext(row, i64)
        offset = builder.mul(row, stride)
        addr = builder.gep(builder.bitcast(ary.data, byte), [offset])
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [byte, i32, i32, i32])
        fn = builder.module.declare_intrinsic("llvm.prefetch", [byte], fnty)
        # (address, read = 0, locality 3 = keep in all levels, data cache = 1)
        builder.call(fn, [addr, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return sig, codegen
