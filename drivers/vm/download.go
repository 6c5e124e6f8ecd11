package vm

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"github.com/digitalocean/go-libvirt"
)

// Downloads do not go through go-libvirt: its StorageVolDownload returns
// at the empty packet that ends the data and leaves the packet that
// follows with no reader, while a lock its connection needs is held
// (digitalocean/go-libvirt#241), and every later call on the connection
// hangs. A download is short and synchronous, so each node has a second
// connection of the driver's own for them, speaking libvirt's RPC
// protocol itself: open, download, finish, one at a time.

// Parts of libvirt's RPC protocol (src/rpc/virnetprotocol.x,
// src/remote/remote_protocol.x).
const (
	rpcProgram      = 0x20008086
	rpcVersion      = 1
	procConnectOpen = 1
	procAuthList    = 66
	procAuthPolkit  = 70
	authPolkit      = 2
	procVolDownload = 209

	typeCall   = 0
	typeReply  = 1
	typeStream = 3

	statusOK       = 0
	statusError    = 1
	statusContinue = 2

	// maxPacket is libvirt's bound of a packet (VIR_NET_MESSAGE_MAX).
	maxPacket = 32 << 20
)

// downloader is a node's connection for downloads.
type downloader struct {
	mu     sync.Mutex // one download at a time; guards serial; taken before cmu
	serial uint32

	cmu    sync.Mutex // guards conn and closed
	conn   net.Conn   // nil until the next download dials
	closed bool       // by the driver's Close: no more dials
}

// download writes length bytes of vol from offset to w.
func (n *node) download(ctx context.Context, vol libvirt.StorageVol, offset, length uint64, w io.Writer) error {
	dl := &n.dl
	dl.mu.Lock()
	defer dl.mu.Unlock()
	dl.cmu.Lock()
	c := dl.conn
	dl.cmu.Unlock()
	if c == nil {
		var err error
		if c, err = n.dial(ctx); err != nil {
			return fmt.Errorf("%w: %s: %w", errUnreachable, n.cfg.URI, err)
		}
		dl.cmu.Lock()
		if dl.closed {
			dl.cmu.Unlock()
			c.Close()
			return fmt.Errorf("%w: the driver was closed", errUnreachable)
		}
		dl.conn = c
		dl.cmu.Unlock()
		stop := during(ctx, c)
		err = dl.open(c, n.target.remote)
		stop()
		if err != nil {
			dl.drop()
			return fmt.Errorf("%w: connect to %s: %w", errUnreachable, n.cfg.URI, err)
		}
	}
	stop := during(ctx, c)
	defer stop()
	var args xdr
	args.string(vol.Pool)
	args.string(vol.Name)
	args.string(vol.Key)
	args.uint64(offset)
	args.uint64(length)
	args.uint32(0)
	if _, err := dl.call(c, procVolDownload, args.b, w); err != nil {
		var le libvirt.Error
		if !errors.As(err, &le) {
			dl.drop() // the connection is in an unknown state
			return fmt.Errorf("%w: %w", errConnLost, err)
		}
		return err
	}
	return nil
}

// open authenticates as go-libvirt does (the daemon wants its list of
// methods asked for, and polkit's check run when it is the one) and opens
// uri.
func (dl *downloader) open(c net.Conn, uri string) error {
	list, err := dl.call(c, procAuthList, nil, nil)
	if err != nil {
		return err
	}
	polkit := false
	if len(list) >= 4 {
		count := binary.BigEndian.Uint32(list)
		for i := uint32(0); i < count && int(4+4*i+4) <= len(list); i++ {
			if binary.BigEndian.Uint32(list[4+4*i:]) == authPolkit {
				polkit = true
			}
		}
	}
	if polkit {
		if _, err := dl.call(c, procAuthPolkit, nil, nil); err != nil {
			return err
		}
	}
	var open xdr
	open.optString(uri)
	open.uint32(0)
	_, err = dl.call(c, procConnectOpen, open.b, nil)
	return err
}

// drop closes the connection; the next download dials again.
func (dl *downloader) drop() {
	dl.cmu.Lock()
	defer dl.cmu.Unlock()
	if dl.conn != nil {
		dl.conn.Close()
		dl.conn = nil
	}
}

// close ends the connection, and with it a download in flight, for good.
func (dl *downloader) close() {
	dl.drop()
	dl.cmu.Lock()
	dl.closed = true
	dl.cmu.Unlock()
}

// call sends a call and reads its reply; with stream set, it also copies
// the stream's data to it until its end, and finishes the stream. (The
// daemon may send data before the reply.) An error the daemon answers is a
// libvirt.Error.
func (dl *downloader) call(c net.Conn, proc uint32, args []byte, stream io.Writer) ([]byte, error) {
	dl.serial++
	serial := dl.serial
	if err := send(c, proc, typeCall, serial, statusOK, args); err != nil {
		return nil, err
	}
	var ret []byte
	replied, ended := false, stream == nil
	for !replied || !ended {
		h, body, err := read(c)
		if err != nil {
			return nil, err
		}
		if h.serial != serial {
			continue
		}
		if h.status == statusError {
			return nil, decodeError(body)
		}
		if h.typ != typeStream {
			replied, ret = true, body
			continue
		}
		switch {
		case stream == nil:
		case h.status == statusOK: // the daemon's confirmation of the end
			ended = true
		case len(body) == 0: // the end of the data: finish the stream
			if err := send(c, proc, typeStream, serial, statusOK, nil); err != nil {
				return nil, err
			}
		default:
			if _, err := stream.Write(body); err != nil {
				return nil, fmt.Errorf("write: %w", err)
			}
		}
	}
	return ret, nil
}

type header struct {
	proc, typ, serial, status uint32
}

func send(c net.Conn, proc, typ, serial, status uint32, payload []byte) error {
	b := make([]byte, 28, 28+len(payload))
	binary.BigEndian.PutUint32(b[0:], uint32(28+len(payload)))
	binary.BigEndian.PutUint32(b[4:], rpcProgram)
	binary.BigEndian.PutUint32(b[8:], rpcVersion)
	binary.BigEndian.PutUint32(b[12:], proc)
	binary.BigEndian.PutUint32(b[16:], typ)
	binary.BigEndian.PutUint32(b[20:], serial)
	binary.BigEndian.PutUint32(b[24:], status)
	_, err := c.Write(append(b, payload...))
	return err
}

func read(c net.Conn) (header, []byte, error) {
	var b [28]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return header{}, nil, err
	}
	size := binary.BigEndian.Uint32(b[0:])
	if size < 28 || size > maxPacket {
		return header{}, nil, fmt.Errorf("a packet of %d bytes", size)
	}
	h := header{
		proc:   binary.BigEndian.Uint32(b[12:]),
		typ:    binary.BigEndian.Uint32(b[16:]),
		serial: binary.BigEndian.Uint32(b[20:]),
		status: binary.BigEndian.Uint32(b[24:]),
	}
	body := make([]byte, size-28)
	if _, err := io.ReadFull(c, body); err != nil {
		return header{}, nil, err
	}
	return h, body, nil
}

// decodeError reads a remote_error: its code, domain and message.
func decodeError(b []byte) error {
	r := bytes.NewReader(b)
	var code, domain, hasMsg uint32
	_ = binary.Read(r, binary.BigEndian, &code)
	_ = binary.Read(r, binary.BigEndian, &domain)
	_ = binary.Read(r, binary.BigEndian, &hasMsg)
	var msg string
	if hasMsg != 0 {
		var n uint32
		if binary.Read(r, binary.BigEndian, &n) == nil && int(n) <= r.Len() {
			m := make([]byte, n)
			_, _ = io.ReadFull(r, m)
			msg = string(m)
		}
	}
	return libvirt.Error{Code: code, Message: msg}
}

// xdr encodes the arguments of a call.
type xdr struct{ b []byte }

func (x *xdr) uint32(v uint32) { x.b = binary.BigEndian.AppendUint32(x.b, v) }
func (x *xdr) uint64(v uint64) { x.b = binary.BigEndian.AppendUint64(x.b, v) }

func (x *xdr) string(s string) {
	x.uint32(uint32(len(s)))
	x.b = append(x.b, s...)
	for len(x.b)%4 != 0 {
		x.b = append(x.b, 0)
	}
}

// optString is a remote_string: present, then the string.
func (x *xdr) optString(s string) {
	x.uint32(1)
	x.string(s)
}
