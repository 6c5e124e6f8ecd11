package bolt

import (
	"encoding/binary"
	"fmt"

	"github.com/berth-dev/berth/store"
)

// The file's layout (format 1):
//
//	meta  "format"  -> u64 1
//	      "rev"     -> u64 current revision
//	      "compact" -> u64 compact revision: the log holds every change after it
//	kv    key       -> u64 create revision, u64 mod revision, value
//	log   u64 rev, u32 index -> u8 event type, u64 create revision,
//	                            uvarint key length, key, value
//
// Integers are big-endian, so log keys sort by revision then op index.
var (
	bucketMeta = []byte("meta")
	bucketKV   = []byte("kv")
	bucketLog  = []byte("log")

	metaFormat  = []byte("format")
	metaRev     = []byte("rev")
	metaCompact = []byte("compact")
)

const (
	formatVersion = 1
	kvHeader      = 16
	logKeyLen     = 12
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

func logKey(rev int64, idx uint32) []byte {
	b := make([]byte, logKeyLen)
	binary.BigEndian.PutUint64(b, uint64(rev))
	binary.BigEndian.PutUint32(b[8:], idx)
	return b
}

func logKeyRev(k []byte) int64 { return int64(binary.BigEndian.Uint64(k)) }

func encodeEvent(typ store.EventType, create int64, key string, value []byte) []byte {
	b := make([]byte, 0, 1+8+binary.MaxVarintLen64+len(key)+len(value))
	b = append(b, byte(typ))
	b = binary.BigEndian.AppendUint64(b, uint64(create))
	b = binary.AppendUvarint(b, uint64(len(key)))
	b = append(b, key...)
	return append(b, value...)
}

// eventKey returns the key of an encoded event without decoding the rest.
func eventKey(b []byte) (key []byte, rest []byte, err error) {
	if len(b) < 9 {
		return nil, nil, fmt.Errorf("store/bolt: corrupt log entry of %d bytes", len(b))
	}
	n, w := binary.Uvarint(b[9:])
	if w <= 0 || uint64(len(b)-9-w) < n {
		return nil, nil, fmt.Errorf("store/bolt: corrupt log entry key length")
	}
	start := 9 + w
	return b[start : start+int(n)], b[start+int(n):], nil
}

func decodeEvent(rev int64, b []byte) (store.Event, error) {
	key, value, err := eventKey(b)
	if err != nil {
		return store.Event{}, err
	}
	ev := store.Event{Type: store.EventType(b[0]), KV: store.KV{Key: string(key), ModRevision: rev}}
	switch ev.Type {
	case store.EventPut:
		ev.KV.CreateRevision = int64(binary.BigEndian.Uint64(b[1:9]))
		ev.KV.Value = append([]byte{}, value...)
	case store.EventDelete:
	default:
		return store.Event{}, fmt.Errorf("store/bolt: corrupt log entry at revision %d: type %d", rev, b[0])
	}
	return ev, nil
}
