// A mock Metal device for Linux (GNUstep Foundation, manual reference counting,
// GCC's Objective-C runtime): the objects the real host code
// (csrc/backends/metal/*.mm) talks to, with the encoder's
// dispatches run through the MSL emulator (the library that
// tests/msl_harness.py builds from metal/*.metal; its path in $MSL_KERNELS_LIB).
//
// As on a Mac, a committed command buffer runs on another thread and calls its
// completion handlers there.  The mock also checks what a driver would not:
// every dispatch has a pipeline, every bound buffer window lies inside its
// buffer, and a failed kernel (the emulator's error) marks the command buffer
// as failed with the message.
#import <Foundation/Foundation.h>
#import <Metal/Metal.h>
#include <Block.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "msl_runtime.h"

typedef const char* (*LaunchFn)(const msl::Dispatch*);

static void* kernels_lib() {
    static void* lib = nullptr;
    if (!lib) {
        const char* path = std::getenv("MSL_KERNELS_LIB");
        lib = path ? dlopen(path, RTLD_NOW) : nullptr;
        if (!lib) {
            std::fprintf(stderr, "mock Metal: cannot load the emulated kernels ($MSL_KERNELS_LIB=%s): %s\n",
                         path ? path : "(unset)", dlerror());
            std::abort();
        }
    }
    return lib;
}

// ---- buffers, functions, pipelines --------------------------------------------------

@interface MockBuffer : NSObject <MTLBuffer> {
  @public
    void* _data;
    NSUInteger _length;
    BOOL _owned;
}
@end
@implementation MockBuffer
- (void*)contents { return _data; }
- (NSUInteger)length { return _length; }
- (NSUInteger)allocatedSize { return _length; }
- (void)dealloc {
    if (_owned) std::free(_data);
    [super dealloc];
}
@end

@interface MockFunction : NSObject <MTLFunction> {
  @public
    NSString* _name;
    LaunchFn _fn;
}
@end
@implementation MockFunction
- (NSString*)name { return _name; }
@end

@interface MockLibrary : NSObject <MTLLibrary>
@end
@implementation MockLibrary
- (id<MTLFunction>)newFunctionWithName:(NSString*)name {
    const std::string sym = std::string("msl_launch_") + [name UTF8String];
    LaunchFn fn = (LaunchFn)dlsym(kernels_lib(), sym.c_str());
    if (!fn) return nil;
    MockFunction* f = [MockFunction new];
    f->_name = [name copy];
    f->_fn = fn;
    return f;
}
- (NSArray<NSString*>*)functionNames { return [NSArray array]; }
@end

@interface MockPipeline : NSObject <MTLComputePipelineState> {
  @public
    MockFunction* _function;
}
@end
@implementation MockPipeline
- (NSUInteger)maxTotalThreadsPerThreadgroup { return 1024; }
- (NSUInteger)threadExecutionWidth { return 32; }
- (NSUInteger)staticThreadgroupMemoryLength { return 0; }
@end

// ---- encoding and execution -------------------------------------------------------------

struct Recorded {
    LaunchFn fn;
    std::string kernel;
    msl::Dispatch d;
    std::vector<unsigned char> bytes;  // the setBytes argument (bound at its index)
    int bytes_index = -1;
};

@interface MockEncoder : NSObject <MTLComputeCommandEncoder> {
  @public
    std::vector<Recorded>* _out;
    MockPipeline* _pipeline;
    msl::Dispatch _d;
    std::vector<unsigned char> _bytes;
    int _bytes_index;
    NSString* _label;
}
@end
@implementation MockEncoder
- (void)setComputePipelineState:(id<MTLComputePipelineState>)state { _pipeline = (MockPipeline*)state; }
- (void)setBytes:(const void*)bytes length:(NSUInteger)length atIndex:(NSUInteger)index {
    _bytes.assign((const unsigned char*)bytes, (const unsigned char*)bytes + length);
    _bytes_index = int(index);
    _d.buffers[index] = nullptr;  // pointed at the copy when recorded
    _d.buffer_bytes[index] = length;
}
- (void)setBuffer:(id<MTLBuffer>)buffer offset:(NSUInteger)offset atIndex:(NSUInteger)index {
    MockBuffer* b = (MockBuffer*)buffer;
    if (index >= msl::kMaxBuffers || offset > b->_length) {
        std::fprintf(stderr, "mock Metal: setBuffer index %lu offset %lu past a buffer of %lu bytes\n",
                     (unsigned long)index, (unsigned long)offset, (unsigned long)b->_length);
        std::abort();
    }
    _d.buffers[index] = (unsigned char*)b->_data + offset;
    _d.buffer_bytes[index] = b->_length - offset;
}
- (void)setThreadgroupMemoryLength:(NSUInteger)length atIndex:(NSUInteger)index { _d.tg_bytes[index] = length; }
- (void)dispatchThreadgroups:(MTLSize)grid threadsPerThreadgroup:(MTLSize)tg {
    if (!_pipeline) {
        std::fprintf(stderr, "mock Metal: dispatch without a pipeline\n");
        std::abort();
    }
    Recorded r;
    r.fn = _pipeline->_function->_fn;
    r.kernel = [[_pipeline->_function name] UTF8String];
    r.d = _d;
    r.d.grid = {uint32_t(grid.width), uint32_t(grid.height), uint32_t(grid.depth)};
    r.d.tg = {uint32_t(tg.width), uint32_t(tg.height), uint32_t(tg.depth)};
    r.d.seed = _out->size();  // a different thread order for every dispatch
    r.bytes = _bytes;
    r.bytes_index = _bytes_index;
    _out->push_back(r);
}
- (void)memoryBarrierWithScope:(MTLBarrierScope)scope {}  // dispatches run in order, one at a time
- (void)endEncoding {}
- (NSString*)label { return _label; }
- (void)setLabel:(NSString*)label { _label = label; }
@end

@interface MockCommandBuffer : NSObject <MTLCommandBuffer> {
  @public
    std::vector<Recorded> _work;
    std::vector<MTLCommandBufferHandler> _handlers;
    MTLCommandBufferStatus _status;
    NSError* _error;
    NSString* _label;
    std::thread* _thread;
}
@end
@implementation MockCommandBuffer
- (id<MTLComputeCommandEncoder>)computeCommandEncoder {
    MockEncoder* e = [MockEncoder new];
    e->_out = &_work;
    e->_bytes_index = -1;
    return e;
}
- (id<MTLComputeCommandEncoder>)computeCommandEncoderWithDispatchType:(MTLDispatchType)t {
    return [self computeCommandEncoder];
}
- (void)addCompletedHandler:(MTLCommandBufferHandler)block {
    _handlers.push_back((MTLCommandBufferHandler)Block_copy(block));  // GCC's runtime: blocks are not objects
}
- (void)commit {
    _status = MTLCommandBufferStatusCommitted;
    if (const char* trace = std::getenv("MOCK_METAL_TRACE")) {  // one line per command buffer: its kernels
        if (FILE* f = std::fopen(trace, "a")) {
            for (const Recorded& r : _work) std::fprintf(f, "%s ", r.kernel.c_str());
            std::fprintf(f, "\n");
            std::fclose(f);
        }
    }
    [self retain];
    _thread = new std::thread([self] {
        for (Recorded& r : _work) {
            if (r.bytes_index >= 0) r.d.buffers[r.bytes_index] = r.bytes.data();
            const char* err = r.fn(&r.d);
            if (err && *err) {
                _error = [[NSError alloc] initWithDomain:@"MockMetal" code:1 userInfo:@{
                    NSLocalizedDescriptionKey : [NSString stringWithFormat:@"%s: %s", r.kernel.c_str(), err]
                }];
                break;
            }
        }
        _status = _error ? MTLCommandBufferStatusError : MTLCommandBufferStatusCompleted;
        for (MTLCommandBufferHandler h : _handlers) {
            h(self);
            Block_release(h);
        }
        [self release];
    });
    _thread->detach();
    delete _thread;
    _thread = nullptr;
}
- (void)waitUntilCompleted {
    while (_status != MTLCommandBufferStatusCompleted && _status != MTLCommandBufferStatusError)
        std::this_thread::yield();
}
- (MTLCommandBufferStatus)status { return _status; }
- (NSError*)error { return _error; }
- (NSString*)label { return _label; }
- (void)setLabel:(NSString*)label { _label = label; }
@end

@interface MockQueue : NSObject <MTLCommandQueue>
@end
@implementation MockQueue
- (id<MTLCommandBuffer>)commandBuffer {
    MockCommandBuffer* c = [MockCommandBuffer new];
    c->_status = MTLCommandBufferStatusNotEnqueued;
    return c;
}
- (id<MTLCommandBuffer>)commandBufferWithUnretainedReferences { return [self commandBuffer]; }
@end

@interface MockDevice : NSObject <MTLDevice>
@end
@implementation MockDevice
- (NSString*)name { return @"mock Metal device (MSL emulator)"; }
- (NSUInteger)maxThreadgroupMemoryLength { return 32768; }
- (MTLSize)maxThreadsPerThreadgroup { return MTLSizeMake(1024, 1024, 1024); }
- (uint64_t)recommendedMaxWorkingSetSize { return 8ull << 30; }
- (NSUInteger)maxBufferLength { return NSUInteger(1) << 36; }
- (BOOL)hasUnifiedMemory { return YES; }
- (id<MTLCommandQueue>)newCommandQueue { return [MockQueue new]; }
- (id<MTLBuffer>)newBufferWithLength:(NSUInteger)length options:(MTLResourceOptions)options {
    MockBuffer* b = [MockBuffer new];
    b->_data = std::calloc(1, length ? length : 1);
    b->_length = length;
    b->_owned = YES;
    return b;
}
- (id<MTLBuffer>)newBufferWithBytes:(const void*)p length:(NSUInteger)length options:(MTLResourceOptions)options {
    MockBuffer* b = (MockBuffer*)[self newBufferWithLength:length options:options];
    std::memcpy(b->_data, p, length);
    return b;
}
- (id<MTLBuffer>)newBufferWithBytesNoCopy:(void*)p
                                   length:(NSUInteger)length
                                  options:(MTLResourceOptions)options
                              deallocator:(void (^)(void*, NSUInteger))deallocator {
    MockBuffer* b = [MockBuffer new];
    b->_data = p;
    b->_length = length;
    b->_owned = NO;
    return b;
}
- (id<MTLLibrary>)newLibraryWithURL:(NSURL*)url error:(NSError**)error {
    kernels_lib();
    return [MockLibrary new];
}
- (id<MTLComputePipelineState>)newComputePipelineStateWithFunction:(id<MTLFunction>)fn error:(NSError**)error {
    MockPipeline* p = [MockPipeline new];
    p->_function = (MockFunction*)fn;
    return p;
}
@end

extern "C" id<MTLDevice> MTLCreateSystemDefaultDevice(void) { return [MockDevice new]; }
