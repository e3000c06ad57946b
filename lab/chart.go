package lab

import (
	"fmt"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// Line is one series of a line chart.
type Line struct {
	Name   string
	X, Y   []float64
	Dashed bool // drawn dashed (targets beside achieved figures)
	Color  int  // index into the chart palette; lines with the same index share a color
}

// LineChart writes a PNG line chart to path. ymax, when not 0, fixes the
// top of the y axis (room for the legend above the data).
func LineChart(path, title, xlabel, ylabel string, ymax float64, lines []Line) error {
	p := plot.New()
	p.Title.Text, p.X.Label.Text, p.Y.Label.Text = title, xlabel, ylabel
	p.Legend.Top = true
	for _, l := range lines {
		xys := make(plotter.XYs, len(l.X))
		for i := range l.X {
			xys[i].X, xys[i].Y = l.X[i], l.Y[i]
		}
		line, err := plotter.NewLine(xys)
		if err != nil {
			return fmt.Errorf("chart %s: %w", path, err)
		}
		line.LineStyle.Color = plotutil.Color(l.Color)
		line.LineStyle.Width = vg.Points(1.5)
		if l.Dashed {
			line.LineStyle.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
			line.LineStyle.Width = vg.Points(1)
		}
		p.Add(line)
		p.Legend.Add(l.Name, line)
	}
	p.Add(plotter.NewGrid())
	if ymax != 0 {
		p.Y.Min, p.Y.Max = 0, ymax
	}
	return save(p, path)
}

// Bars is one series of a grouped bar chart.
type Bars struct {
	Name   string
	Values []float64 // one per category
}

// BarChart writes a PNG grouped bar chart to path; ymax as LineChart's.
func BarChart(path, title, ylabel string, ymax float64, categories []string, series []Bars) error {
	p := plot.New()
	p.Title.Text, p.Y.Label.Text = title, ylabel
	p.Legend.Top = true
	w := vg.Points(14)
	for i, s := range series {
		bc, err := plotter.NewBarChart(plotter.Values(s.Values), w)
		if err != nil {
			return fmt.Errorf("chart %s: %s: %w", path, s.Name, err)
		}
		bc.Color = plotutil.Color(i)
		bc.LineStyle.Width = 0
		bc.Offset = w * vg.Length(float64(i)-float64(len(series)-1)/2)
		p.Add(bc)
		p.Legend.Add(s.Name, bc)
	}
	p.NominalX(categories...)
	p.Add(plotter.NewGrid())
	if ymax != 0 {
		p.Y.Min, p.Y.Max = 0, ymax
	}
	return save(p, path)
}

func save(p *plot.Plot, path string) error {
	if err := p.Save(7*vg.Inch, 4*vg.Inch, path); err != nil {
		return fmt.Errorf("chart %s: %w", path, err)
	}
	return nil
}
