/* What a compiled module records about its own build, for reports such as
   the benchmark header (``leasequeue bench``).  Included by each .pyx. */
#ifndef LEASEQUEUE_LQ_BUILD_H
#define LEASEQUEUE_LQ_BUILD_H

/* The Cython that generated the including module's C code, as a str:
   "3.1.2", "3.2.0b1".  CYTHON_HEX_VERSION is defined by Cython at the top
   of every C file it writes (encoded like PY_VERSION_HEX), so this is the
   version that compiled the extension, whatever Cython is importable (if
   any) when it runs. */
static PyObject *lq_cython_version(void) {
    unsigned long h = (unsigned long)CYTHON_HEX_VERSION;
    unsigned long level = (h >> 4) & 0xF, serial = h & 0xF;
    const char *tag = level == 0xA ? "a" : level == 0xB ? "b" : level == 0xC ? "rc" : "";
    if (*tag)
        return PyUnicode_FromFormat("%lu.%lu.%lu%s%lu", h >> 24, (h >> 16) & 0xFF, (h >> 8) & 0xFF, tag, serial);
    return PyUnicode_FromFormat("%lu.%lu.%lu", h >> 24, (h >> 16) & 0xFF, (h >> 8) & 0xFF);
}

#endif /* LEASEQUEUE_LQ_BUILD_H */
