# The sparse-bitmask codec: every CPU decoder against the data and the scalar
# decoder, validation, threading, dispatch (bitmask_test); the GPU kernel's
# code with the warp emulated (bitmask_kernel_test); DeviceStream::
# DecodeBitmask on the emulated and host devices (bitmask_device_test).
tl_sparse_test(bitmask_test bitmask_test.cc)
tl_sparse_test(bitmask_kernel_test bitmask_kernel_test.cc)
tl_sparse_test(bitmask_device_test bitmask_device_test.cc)
