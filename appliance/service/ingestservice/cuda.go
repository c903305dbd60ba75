//go:build cuda

package ingestservice

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/devmem"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/devmem/cuda"
)

// CUDABuilt says whether this lovelockd has the CUDA backend: built with
// -tags cuda (make lovelockd-cuda), which links it dynamically (purego
// loads libcuda through the system's loader). The DPU image's static
// lovelockd has not.
const CUDABuilt = true

// cudaDevices opens every GPU the driver sees; cards[i], if set, names
// GPU i's MIG card where the driver's name does not. A GPU whose MIG
// geometry, read from NVML, differs from the scheduler's table of its card
// is refused (checkGeometry). legacyIPC makes every buffer export a legacy
// CUDA IPC handle (cuda.Options.LegacyIPC).
func cudaDevices(cfg []GPUConfig, legacyIPC bool, log *slog.Logger) ([]devmem.Device, []string, error) {
	var devs []devmem.Device
	var cards []string
	fail := func(err error) ([]devmem.Device, []string, error) {
		for _, d := range devs {
			d.Close()
		}
		return nil, nil, err
	}
	for i := 0; ; i++ {
		d, err := cuda.Open(cuda.Options{Index: i, LegacyIPC: legacyIPC})
		if errors.Is(err, cuda.ErrNoDevice) && i > 0 {
			break
		}
		if err != nil {
			return fail(fmt.Errorf("ingest_host: GPU %d: %w", i, err))
		}
		devs = append(devs, d)
		card := d.Info().Card
		if i < len(cfg) && cfg[i].Card != "" {
			card = cfg[i].Card
		}
		cards = append(cards, card)
		if card == "" {
			continue // the host agent refuses it, naming the config field
		}
		live, readErr := d.MIGProfiles()
		note, err := checkGeometry(i, card, live, readErr)
		if err != nil {
			return fail(err)
		}
		log.Info(note)
	}
	return devs, cards, nil
}

// importer maps memfds itself and CUDA handles through the driver, which
// it loads at the first CUDA handle.
type importer struct {
	mu   sync.Mutex
	cuda *cuda.Importer
}

func newImporter() devmem.Importer { return &importer{} }

func (im *importer) Import(h devmem.Handle) (devmem.Mapping, error) {
	if h.Kind == devmem.HandleMemfd {
		return devmem.ShmImporter{}.Import(h)
	}
	im.mu.Lock()
	if im.cuda == nil {
		c, err := cuda.NewImporter(cuda.ImporterOptions{})
		if err != nil {
			im.mu.Unlock()
			devmem.ShmImporter{}.Import(h) // closes the descriptor
			return nil, fmt.Errorf("ingest: map the host's %s buffers: %w", h.Kind, err)
		}
		im.cuda = c
	}
	c := im.cuda
	im.mu.Unlock()
	return c.Import(h)
}

func (im *importer) Close() error {
	im.mu.Lock()
	defer im.mu.Unlock()
	if im.cuda != nil {
		return im.cuda.Close()
	}
	return nil
}
