package vmtest

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
)

// uncompressed returns the kernel the guest boots: the ELF image inside the
// packaged bzImage at bzImage, taken out once into dir, which QEMU starts at
// its PVH entry point instead of having the guest decompress it first.
// Under TCG the decompression is emulated and took close to half the cpu of
// a boot (docs/benchmarks.md, "VMs"). It returns bzImage itself, and why,
// when the image cannot be taken out: a compression other than gzip or xz,
// no xz program, or a kernel built without a PVH entry point (CONFIG_PVH).
func uncompressed(bzImage, dir string) (string, error) {
	b, err := os.ReadFile(bzImage)
	if err != nil {
		return bzImage, err
	}
	sum := sha256.Sum256(b)
	out := filepath.Join(dir, fmt.Sprintf("vmlinux-%x", sum[:6]))
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	payload, err := bzPayload(b)
	if err != nil {
		return bzImage, err
	}
	img, err := decompress(payload)
	if err != nil {
		return bzImage, err
	}
	if err := hasPVHEntry(img); err != nil {
		return bzImage, err
	}
	tmp := out + ".tmp"
	if err := os.WriteFile(tmp, img, 0o644); err != nil {
		return bzImage, err
	}
	if err := os.Rename(tmp, out); err != nil {
		return bzImage, err
	}
	return out, nil
}

// bzPayload returns the compressed kernel of a bzImage, as the x86 boot
// protocol (2.08 and later) places it: payload_offset bytes into the
// protected-mode code, which follows the setup sectors.
func bzPayload(b []byte) ([]byte, error) {
	if len(b) < 0x250 || string(b[0x202:0x206]) != "HdrS" {
		return nil, errors.New("not a bzImage")
	}
	if v := binary.LittleEndian.Uint16(b[0x206:]); v < 0x208 {
		return nil, fmt.Errorf("boot protocol %#x, before payload_offset (2.08)", v)
	}
	setup := int(b[0x1f1])
	if setup == 0 {
		setup = 4
	}
	off := (setup+1)*512 + int(binary.LittleEndian.Uint32(b[0x248:]))
	n := int(binary.LittleEndian.Uint32(b[0x24c:]))
	if off < 0 || n <= 0 || off+n > len(b) {
		return nil, errors.New("payload out of the file")
	}
	return b[off : off+n], nil
}

// decompress decompresses a kernel payload compressed with gzip or xz (the
// latter with the xz program, which Go's library lacks).
func decompress(p []byte) ([]byte, error) {
	switch {
	case bytes.HasPrefix(p, []byte{0x1f, 0x8b}):
		zr, err := gzip.NewReader(bytes.NewReader(p))
		if err != nil {
			return nil, err
		}
		// The payload ends with the image's size, after the stream.
		zr.Multistream(false)
		return io.ReadAll(zr)
	case bytes.HasPrefix(p, []byte("\xfd7zXZ\x00")):
		var out, errOut bytes.Buffer
		cmd := exec.Command("xz", "--decompress", "--stdout", "--single-stream")
		cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(p), &out, &errOut
		if err := cmd.Run(); err != nil {
			return nil, fmt.Errorf("xz: %w: %s (apt-get install xz-utils)", err, bytes.TrimSpace(errOut.Bytes()))
		}
		return out.Bytes(), nil
	}
	return nil, fmt.Errorf("payload compressed with neither gzip nor xz (starts % x)", p[:min(len(p), 6)])
}

// hasPVHEntry checks that img is an x86-64 ELF image with Xen's
// PHYS32_ENTRY note, the entry point QEMU boots an ELF kernel at.
func hasPVHEntry(img []byte) error {
	f, err := elf.NewFile(bytes.NewReader(img))
	if err != nil {
		return err
	}
	if f.Machine != elf.EM_X86_64 {
		return fmt.Errorf("kernel image for %s", f.Machine)
	}
	const phys32Entry = 18 // XEN_ELFNOTE_PHYS32_ENTRY
	for _, p := range f.Progs {
		if p.Type != elf.PT_NOTE {
			continue
		}
		notes, err := io.ReadAll(p.Open())
		if err != nil {
			return err
		}
		for len(notes) >= 12 {
			nameSize := int(binary.LittleEndian.Uint32(notes))
			descSize := int(binary.LittleEndian.Uint32(notes[4:]))
			typ := binary.LittleEndian.Uint32(notes[8:])
			name := 12 + (nameSize+3)&^3
			next := name + (descSize+3)&^3
			if next > len(notes) || next < 12 {
				break
			}
			if typ == phys32Entry && bytes.Equal(bytes.TrimRight(notes[12:12+nameSize], "\x00"), []byte("Xen")) {
				return nil
			}
			notes = notes[next:]
		}
	}
	return errors.New("kernel without a PVH entry point (CONFIG_PVH)")
}
