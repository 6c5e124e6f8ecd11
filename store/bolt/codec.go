package bolt

import (
	"encoding/binary"
	"fmt"

	"github.com/berth-dev/berth/store"
)

// The file's layout (format 2):
//
//	meta  "format"  -> u64 2
//	      "rev"     -> u64 current revision
//	kv    key       -> u64 create revision, u64 mod revision, value
//
// Integers are big-endian. Format 1 also held a change log (bucket "log",
// meta "compact"); Open drops them.
var (
	bucketMeta = []byte("meta")
	bucketKV   = []byte("kv")
	bucketLog  = []byte("log")

	metaFormat  = []byte("format")
	metaRev     = []byte("rev")
	metaCompact = []byte("compact")
)

const (
	formatVersion = 2
	kvHeader      = 16
)

func u64(v int64) []byte { return binary.BigEndian.AppendUint64(nil, uint64(v)) }

func getU64(b []byte) (int64, error) {
	if b == nil {
		return 0, nil
	}
	if len(b) != 8 {
		return 0, fmt.Errorf("store/bolt: corrupt counter of %d bytes", len(b))
	}
	return int64(binary.BigEndian.Uint64(b)), nil
}

func encodeKV(create, mod int64, value []byte) []byte {
	b := make([]byte, kvHeader, kvHeader+len(value))
	binary.BigEndian.PutUint64(b, uint64(create))
	binary.BigEndian.PutUint64(b[8:], uint64(mod))
	return append(b, value...)
}

// decodeKV decodes a kv bucket entry; the value is copied out of the
// transaction's memory.
func decodeKV(key string, b []byte) (store.KV, error) {
	if len(b) < kvHeader {
		return store.KV{}, fmt.Errorf("store/bolt: corrupt entry for key %q: %d bytes", key, len(b))
	}
	return store.KV{
		Key:            key,
		CreateRevision: int64(binary.BigEndian.Uint64(b)),
		ModRevision:    int64(binary.BigEndian.Uint64(b[8:])),
		Value:          append([]byte{}, b[kvHeader:]...),
	}, nil
}

func modRevision(b []byte) int64 {
	if len(b) < kvHeader {
		return 0
	}
	return int64(binary.BigEndian.Uint64(b[8:]))
}

func createRevision(b []byte) int64 {
	if len(b) < kvHeader {
		return 0
	}
	return int64(binary.BigEndian.Uint64(b))
}
