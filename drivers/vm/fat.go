package vm

import (
	"encoding/binary"
	"fmt"
	"unicode/utf16"
)

// fatFile is one file of a FAT image's root directory.
type fatFile struct {
	name string // a long name: ASCII, at most 255 bytes
	data []byte
}

// FAT12 geometry of the images fatImage writes: 4 MiB, 4 KiB clusters.
const (
	fatSector      = 512
	fatSectors     = 8192
	fatPerCluster  = 8
	fatRootEntries = 512
	fatCluster     = fatSector * fatPerCluster
)

// fatImage writes a FAT12 file system labelled label holding files in its
// root directory, with long (VFAT) names.
func fatImage(label string, files []fatFile) ([]byte, error) {
	rootSectors := fatRootEntries * 32 / fatSector
	fatSize := 1
	var clusters int
	for {
		data := fatSectors - 1 - 2*fatSize - rootSectors
		clusters = data / fatPerCluster
		need := ((clusters+2)*3/2 + fatSector - 1) / fatSector
		if need <= fatSize {
			break
		}
		fatSize = need
	}
	img := make([]byte, fatSectors*fatSector)

	// Boot sector and BIOS parameter block.
	b := img[:fatSector]
	copy(b, []byte{0xEB, 0x3C, 0x90})
	copy(b[3:], "BERTH   ")
	binary.LittleEndian.PutUint16(b[11:], fatSector)
	b[13] = fatPerCluster
	binary.LittleEndian.PutUint16(b[14:], 1)
	b[16] = 2
	binary.LittleEndian.PutUint16(b[17:], fatRootEntries)
	binary.LittleEndian.PutUint16(b[19:], fatSectors)
	b[21] = 0xF8
	binary.LittleEndian.PutUint16(b[22:], uint16(fatSize))
	binary.LittleEndian.PutUint16(b[24:], 32)
	binary.LittleEndian.PutUint16(b[26:], 64)
	b[36] = 0x80
	b[38] = 0x29
	binary.LittleEndian.PutUint32(b[39:], 0x42455254)
	copy(b[43:54], pad11(label))
	copy(b[54:62], "FAT12   ")
	b[510], b[511] = 0x55, 0xAA

	fat := make([]byte, fatSize*fatSector)
	setFAT := func(n int, v uint16) {
		off := n * 3 / 2
		if n%2 == 0 {
			fat[off] = byte(v)
			fat[off+1] = fat[off+1]&0xF0 | byte(v>>8)&0x0F
		} else {
			fat[off] = fat[off]&0x0F | byte(v<<4)
			fat[off+1] = byte(v >> 4)
		}
	}
	setFAT(0, 0xFF8)
	setFAT(1, 0xFFF)

	rootOff := (1 + 2*fatSize) * fatSector
	dataOff := rootOff + rootSectors*fatSector
	var dir []byte
	entry := func(name []byte, attr byte, cluster int, size int) []byte {
		e := make([]byte, 32)
		copy(e, name)
		e[11] = attr
		const date = (2026-1980)<<9 | 1<<5 | 1
		for _, o := range []int{16, 18, 24} {
			binary.LittleEndian.PutUint16(e[o:], date)
		}
		binary.LittleEndian.PutUint16(e[26:], uint16(cluster))
		binary.LittleEndian.PutUint32(e[28:], uint32(size))
		return e
	}
	dir = append(dir, entry(pad11(label), 0x08, 0, 0)...)
	next := 2
	for i, f := range files {
		short := []byte(fmt.Sprintf("BERTH%03d   ", i))
		dir = append(dir, lfnEntries(f.name, short)...)
		first := 0
		if len(f.data) > 0 {
			n := (len(f.data) + fatCluster - 1) / fatCluster
			if next+n > clusters+2 {
				return nil, fmt.Errorf("config drive: %d bytes do not fit", len(f.data))
			}
			first = next
			for c := range n {
				if c == n-1 {
					setFAT(next, 0xFFF)
				} else {
					setFAT(next, uint16(next+1))
				}
				next++
			}
			copy(img[dataOff+(first-2)*fatCluster:], f.data)
		}
		dir = append(dir, entry(short, 0x20, first, len(f.data))...)
	}
	if len(dir) > fatRootEntries*32 {
		return nil, fmt.Errorf("config drive: too many files")
	}
	copy(img[rootOff:], dir)
	copy(img[fatSector:], fat)
	copy(img[(1+fatSize)*fatSector:], fat)
	return img, nil
}

func pad11(s string) []byte {
	b := []byte("           ")
	copy(b, s)
	return b
}

// lfnEntries are the long-name entries that go before the 8.3 entry short.
func lfnEntries(name string, short []byte) []byte {
	var sum byte
	for _, c := range short[:11] {
		sum = (sum&1)<<7 + sum>>1 + c
	}
	u := utf16.Encode([]rune(name))
	if len(u)%13 != 0 {
		u = append(u, 0)
		for len(u)%13 != 0 {
			u = append(u, 0xFFFF)
		}
	}
	n := len(u) / 13
	var out []byte
	for i := n; i >= 1; i-- {
		e := make([]byte, 32)
		e[0] = byte(i)
		if i == n {
			e[0] |= 0x40
		}
		e[11] = 0x0F
		e[13] = sum
		part := u[(i-1)*13 : i*13]
		offs := []int{1, 3, 5, 7, 9, 14, 16, 18, 20, 22, 24, 28, 30}
		for j, o := range offs {
			binary.LittleEndian.PutUint16(e[o:], part[j])
		}
		out = append(out, e...)
	}
	return out
}
